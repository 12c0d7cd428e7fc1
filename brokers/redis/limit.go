package redis

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/forwarder"
)

// DefaultMaxFieldBytes is Redis's default proto-max-bulk-len, 512 MB: the
// ceiling assumed when the server does not let CONFIG GET read its own
// (a managed Redis that renames or forbids CONFIG, an ACL user without
// +config|get).
const DefaultMaxFieldBytes = 512 << 20

var _ forwarder.PayloadLimiter = (*Broker)(nil)

// ProtoMaxBulkLen reads the server's proto-max-bulk-len with CONFIG GET:
// on a Cluster, the smallest of its primaries'. A server that refuses
// CONFIG GET gives [DefaultMaxFieldBytes], logged at debug level; a
// connection error is returned.
func ProtoMaxBulkLen(ctx context.Context, client goredis.UniversalClient, logger *slog.Logger) (int, error) {
	if logger == nil {
		logger = slog.Default()
	}
	read := func(ctx context.Context, c goredis.UniversalClient) (int, error) {
		m, err := c.ConfigGet(ctx, "proto-max-bulk-len").Result()
		var rerr goredis.Error
		if errors.As(err, &rerr) {
			logger.DebugContext(ctx, "redis: CONFIG GET proto-max-bulk-len refused; assuming Redis's default", "error", err, "bytes", DefaultMaxFieldBytes)
			return DefaultMaxFieldBytes, nil
		}
		if err != nil {
			return 0, err
		}
		n, err := strconv.Atoi(strings.TrimSpace(m["proto-max-bulk-len"]))
		if err != nil || n <= 0 {
			return DefaultMaxFieldBytes, nil
		}
		return n, nil
	}
	cc, ok := client.(*goredis.ClusterClient)
	if !ok {
		return read(ctx, client)
	}
	var (
		mu    sync.Mutex
		least int
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
		n, err := read(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if least == 0 || n < least {
			least = n
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return least, nil
}

// MaxMessageBytes is the server's proto-max-bulk-len (Config.MaxFieldBytes),
// which XADD checks against each field value of an entry.
func (b *Broker) MaxMessageBytes() int { return b.cfg.MaxFieldBytes }

// MessageBytes is the largest field value of m's entry as the broker
// writes it: the payload, or the encoded metadata when that is larger.
func (b *Broker) MessageBytes(m forwarder.Outgoing) int {
	values, err := b.cfg.Marshaller.Marshal(m.Topic, m.Message)
	if err != nil {
		return 0 // Publish reports it
	}
	n := 0
	for _, v := range values {
		switch v := v.(type) {
		case string:
			n = max(n, len(v))
		case []byte:
			n = max(n, len(v))
		}
	}
	return n
}
