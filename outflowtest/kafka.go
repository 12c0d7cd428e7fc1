package outflowtest

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Kafka starts an in-process fake Kafka cluster for t (franz-go's kfake:
// one broker on a free 127.0.0.1 port, topics created on demand) and
// returns its bootstrap addresses; the cluster is closed when t ends.
// Consumer group session timeouts down to 1s are accepted, so tests can
// make a dead member's partitions move quickly. opts are added to those.
//
// kfake speaks the Kafka protocol to any client, but it is not Kafka: no
// replication (writes are acknowledged at once), no throttling, no initial
// rebalance delay, and it keeps data in memory.
func Kafka(t testing.TB, opts ...kfake.Opt) []string {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		kfake.GroupMinSessionTimeout(time.Second),
	}, opts...)...)
	if err != nil {
		t.Fatalf("outflowtest: start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}
