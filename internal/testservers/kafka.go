package testservers

import (
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Kafka starts an in-process fake Kafka cluster for t and returns its
// bootstrap addresses; see [StartKafka].
func Kafka(t testing.TB, opts ...kfake.Opt) []string {
	t.Helper()
	return StartKafka(t, opts...).Addrs
}

// KafkaCluster is an in-process fake Kafka cluster (franz-go's kfake: one
// broker on a free 127.0.0.1 port, topics created on demand) whose
// connections the test can cut to play an outage: Stop closes every client
// connection and refuses new ones, Start accepts them again. The data
// stays, as on a Kafka broker that restarts.
//
// kfake speaks the Kafka protocol to any client, but it is not Kafka: no
// replication (writes are acknowledged at once), no throttling, no initial
// rebalance delay, and it keeps data in memory.
type KafkaCluster struct {
	Addrs []string
	ln    []*cutListener
}

// StartKafka starts the cluster, closed when t ends. Consumer group session
// timeouts down to 1s are accepted, so tests can make a dead member's
// partitions move quickly. opts are added to those.
func StartKafka(t testing.TB, opts ...kfake.Opt) *KafkaCluster {
	t.Helper()
	k := &KafkaCluster{}
	c, err := kfake.NewCluster(append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		kfake.GroupMinSessionTimeout(time.Second),
		kfake.ListenFn(func(_, addr string) (net.Listener, error) {
			ln, err := newCutListener(addr)
			if err == nil {
				k.ln = append(k.ln, ln)
			}
			return ln, err
		}),
	}, opts...)...)
	if err != nil {
		t.Fatalf("outflowtest: start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	k.Addrs = c.ListenAddrs()
	return k
}

// Stop cuts every client connection and refuses new ones until Start.
func (k *KafkaCluster) Stop() {
	for _, ln := range k.ln {
		ln.Stop()
	}
}

// Start accepts client connections again.
func (k *KafkaCluster) Start() {
	for _, ln := range k.ln {
		ln.Start()
	}
}
