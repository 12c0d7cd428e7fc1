package brokers_test

import (
	"os/exec"
	"strings"
	"testing"
)

// clients are the broker client libraries, by the backend that may link
// them.
var clients = map[string][]string{
	"redis": {"github.com/redis/go-redis/", "github.com/ThreeDotsLabs/watermill-redisstream/"},
	"nats":  {"github.com/nats-io/nats.go", "github.com/ThreeDotsLabs/watermill-nats/"},
	"amqp":  {"github.com/rabbitmq/amqp091-go", "github.com/ThreeDotsLabs/watermill-amqp/"},
	"kafka": {"github.com/IBM/sarama", "github.com/twmb/franz-go/", "github.com/ThreeDotsLabs/watermill-kafka/"},
	"sql":   {"github.com/ThreeDotsLabs/watermill-sql/"},
}

const module = "github.com/outflow-dev/outflow/"

func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", module+pkg).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr)
	}
	return strings.Fields(string(out))
}

// linked reports the client packages of backend among ds.
func linked(ds []string, backend string) []string {
	var out []string
	for _, d := range ds {
		for _, prefix := range clients[backend] {
			if strings.HasPrefix(d, prefix) {
				out = append(out, d)
			}
		}
	}
	return out
}

// A service links only the broker clients it uses: the framework's own
// packages none (the Worker is given the Backend its caller opened), each
// backend its own only.
func TestEachPackageLinksOnlyItsBrokerClient(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		pkg     string
		allowed string // the one backend whose client it may link
	}{
		{"brokers", ""},
		{"forwarder", ""},
		{"brokers/watermillpub", ""},
		{"brokers/watermillbackend", ""},
		{"consumer", ""},
		// The user's test kit: its pipeline's default broker is
		// PostgreSQL; another is linked only by a test that imports it.
		{"outflowtest", "sql"},
		{"brokers/redis", "redis"},
		{"brokers/nats", "nats"},
		{"brokers/amqp", "amqp"},
		{"brokers/kafka", "kafka"},
		{"brokers/sql", "sql"},
	} {
		t.Run(tt.pkg, func(t *testing.T) {
			t.Parallel()
			ds := deps(t, tt.pkg)
			for backend := range clients {
				if backend == tt.allowed {
					if len(linked(ds, backend)) == 0 {
						t.Errorf("%s links no %s client: the check does not see what it should", tt.pkg, backend)
					}
					continue
				}
				if l := linked(ds, backend); len(l) > 0 {
					t.Errorf("%s links the %s client: %v", tt.pkg, backend, l)
				}
			}
		})
	}
	t.Run("brokers/all", func(t *testing.T) {
		t.Parallel()
		ds := deps(t, "brokers/all")
		for backend := range clients {
			if len(linked(ds, backend)) == 0 {
				t.Errorf("brokers/all does not link the %s client", backend)
			}
		}
	})
}
