package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/brokers"
	redisstreams "github.com/outflow-dev/outflow/brokers/redis"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/internal/testservers"
	"github.com/outflow-dev/outflow/outflowtest"
)

type blob struct {
	Data string `json:"data"`
}

func (blob) EventType() string { return "blob.stored" }

// The ceiling is the server's proto-max-bulk-len, read with CONFIG GET:
// the server refuses a field one byte over it, takes one at it, and the
// outbox writer refuses, inside the business transaction, an event whose
// entry would not fit.
func TestCeilingIsProtoMaxBulkLen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const limit = 1 << 20 // the smallest proto-max-bulk-len Redis takes
	srv := testservers.StartRedis(t, "--proto-max-bulk-len", "1mb")
	b := openBackend(t, brokers.Config{Kind: brokers.Redis, Redis: brokers.RedisConfig{URL: srv.URL}})
	lim, ok := b.Broker().(forwarder.PayloadLimiter)
	require.True(t, ok)
	require.Equal(t, limit, lim.MaxMessageBytes())

	c := goredis.NewClient(&goredis.Options{Addr: strings.TrimSuffix(strings.TrimPrefix(srv.URL, "redis://"), "/0")})
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.XAdd(ctx, &goredis.XAddArgs{Stream: "at", Values: []any{"payload", strings.Repeat("x", limit)}}).Err())
	// The server answers "invalid bulk length" and closes the connection:
	// the client, still writing the field, may see the reset first.
	err := c.XAdd(ctx, &goredis.XAddArgs{Stream: "over", Values: []any{"payload", strings.Repeat("x", limit+1)}}).Err()
	require.Error(t, err, "the server's own refusal one byte over")
	require.Zero(t, c.Exists(ctx, "over").Val(), "nothing of it taken: %v", err)

	s := outflowtest.NewSchema(t)
	w, err := outbox.NewWriter(outbox.Config{Broker: b.Broker(), MaxEventBytes: -1})
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, s.Pool, func(tx pgx.Tx) error {
		return w.WriteTx(ctx, tx, events.Aggregate{Type: "blob", ID: uuid.NewString(), Version: 1}, blob{Data: strings.Repeat("x", limit)})
	})
	var tl *outbox.EventTooLargeError
	require.True(t, errors.As(err, &tl), "%v", err)
	require.True(t, tl.Broker)
	require.Equal(t, limit, tl.Limit)
	require.Equal(t, limit+len(`{"data": ""}`), tl.Size, "the entry's largest field, the payload as forwarded")
}

// A server that does not let CONFIG GET read its settings gives Redis's
// default, not its own (unreadable) 2 MB, and the backend opens.
func TestCeilingDefaultWithoutConfigGet(t *testing.T) {
	t.Parallel()
	srv := testservers.StartRedis(t, "--proto-max-bulk-len", "2mb", "--rename-command", "CONFIG", "")
	b := openBackend(t, brokers.Config{Kind: brokers.Redis, Redis: brokers.RedisConfig{URL: srv.URL}})
	require.Equal(t, redisstreams.DefaultMaxFieldBytes, b.Broker().(forwarder.PayloadLimiter).MaxMessageBytes())
}
