package outflowtest

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// DefaultNATSURL is the test NATS used when OUTFLOW_TEST_NATS_URL is not
// set.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// NATSURL returns the test NATS URL.
func NATSURL() string {
	if u := os.Getenv("OUTFLOW_TEST_NATS_URL"); u != "" {
		return u
	}
	return DefaultNATSURL
}

// NATSPrefix checks that the test NATS answers with JetStream and returns a
// prefix for stream and subject names no other test uses; streams whose
// name starts with it are deleted when t ends.
func NATSPrefix(t testing.TB) string {
	t.Helper()
	conn, err := nats.Connect(NATSURL(), nats.Timeout(3*time.Second))
	if err == nil {
		var js nats.JetStreamContext
		if js, err = conn.JetStream(); err == nil {
			_, err = js.AccountInfo()
		}
		if err != nil {
			conn.Close()
		}
	}
	if err != nil {
		t.Fatalf("outflowtest: NATS with JetStream is not reachable at %s: %v\n"+
			"Start it with `make services-up` (nats-server -js), or point OUTFLOW_TEST_NATS_URL at a server you run.", NATSURL(), err)
	}
	prefix := "t" + randomHex(6) + "_"
	t.Cleanup(func() {
		defer conn.Close()
		js, err := conn.JetStream()
		if err != nil {
			return
		}
		for name := range js.StreamNames() {
			if strings.HasPrefix(name, prefix) {
				_ = js.DeleteStream(name)
			}
		}
	})
	return prefix
}
