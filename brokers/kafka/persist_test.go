package kafka_test

import (
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
)

// persistentKafka is a kfake cluster that keeps its data in a directory
// (kfake.DataDir) and listens on a fixed port, so that a test can stop it
// and start it again on the same data, or on an older copy of one topic's
// log: a truncation as a log restored from an older copy leaves it (the
// topic id, the consumer groups' offsets and the producers' state kept).
// kfake has no replication, so an unclean leader election, the other way
// Kafka truncates a log, cannot be played; it cuts the log the same way.
type persistentKafka struct {
	t     testing.TB
	dir   string
	port  int
	c     *kfake.Cluster
	Addrs []string
	saved string // the copy snapshot took, "" before
}

func startPersistentKafka(t testing.TB) *persistentKafka {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	k := &persistentKafka{t: t, dir: t.TempDir(), port: port}
	k.start()
	t.Cleanup(func() { k.c.Close() })
	return k
}

func (k *persistentKafka) start() {
	k.t.Helper()
	var err error
	// The port was just released by the cluster's Close: a retry covers
	// the moment the kernel takes to let it go.
	deadline := time.Now().Add(10 * time.Second)
	for {
		k.c, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(k.port), kfake.DataDir(filepath.Join(k.dir, "data")),
			kfake.AllowAutoTopicCreation(), kfake.GroupMinSessionTimeout(time.Second))
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(k.t, err, "start kfake")
	k.Addrs = k.c.ListenAddrs()
}

// snapshot stops the cluster, copies its data (as a replica, or a backup,
// has it now) and starts it again.
func (k *persistentKafka) snapshot() {
	k.t.Helper()
	k.c.Close()
	k.saved = filepath.Join(k.dir, "saved")
	require.NoError(k.t, os.RemoveAll(k.saved))
	copyTree(k.t, filepath.Join(k.dir, "data"), k.saved)
	k.start()
}

// truncate stops the cluster, puts back the Kafka topic's partitions as
// snapshot copied them, and starts it again: what was written to them
// since is gone, the high watermarks are back where they were, the topic
// keeps its id and the groups keep the offsets they committed since.
func (k *persistentKafka) truncate(topic string) {
	k.t.Helper()
	require.NotEmpty(k.t, k.saved, "truncate before snapshot")
	k.c.Close()
	parts, err := filepath.Glob(filepath.Join(k.dir, "data", "partitions", url.PathEscape(topic)+"-*"))
	require.NoError(k.t, err)
	require.NotEmpty(k.t, parts, "no partition of %s on disk", topic)
	for _, p := range parts {
		require.NoError(k.t, os.RemoveAll(p))
		old := filepath.Join(k.saved, "partitions", filepath.Base(p))
		if _, err := os.Stat(old); err == nil {
			copyTree(k.t, old, p)
		}
	}
	k.start()
}

func copyTree(t testing.TB, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		out, err := os.Create(dst)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, src); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	require.NoError(t, err)
}
