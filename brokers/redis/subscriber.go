package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	goredis "github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/brokers"
	"github.com/outflow-dev/outflow/internal/backoff"
	"github.com/outflow-dev/outflow/internal/configcheck"
	"github.com/outflow-dev/outflow/internal/subloop"
)

// SubscriberConfig configures a [Subscriber].
type SubscriberConfig struct {
	// Client is the Redis connection. Required. The subscriber does not
	// close it. Each subscribed stream keeps one connection busy in a
	// blocking read: size the client's pool for it.
	Client goredis.UniversalClient
	// ConsumerGroup is the stream consumer group, one per logical consumer.
	// Required.
	ConsumerGroup string
	// Consumer names this subscriber within the group: unique per process.
	// Required.
	Consumer string
	// BatchSize is how many entries one read takes and delivers at once.
	// Defaults to 100.
	BatchSize int
	// BlockTime is how long a read waits for new entries; it also bounds how
	// long Close waits for a read in flight. Defaults to 1s.
	BlockTime time.Duration
	// ClaimIdle is how long an entry delivered to another consumer of the
	// group may stay unacknowledged before this one claims it: a dead
	// consumer's entries move after it. Keep it above the slowest handler,
	// or a live consumer's entry is processed twice (harmless behind the
	// idempotency middleware, but wasted). Defaults to
	// brokers.DefaultClaimIdle.
	ClaimIdle time.Duration
	// ClaimInterval is how often idle entries are looked for. Defaults to a
	// quarter of ClaimIdle.
	ClaimInterval time.Duration
	// NackResendSleep is the pause before nacked messages are delivered
	// again. Defaults to 1s.
	NackResendSleep time.Duration
	// OldestID is where a new consumer group starts. Defaults to "0": the
	// whole stream, so that nothing published before the first Subscribe is
	// missed.
	OldestID string
	// Unmarshaller decodes entries. Defaults to watermill-redisstream's.
	Unmarshaller redisstream.Unmarshaller
	// Logger defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *SubscriberConfig) setDefaults() {
	c.BatchSize = cmp.Or(c.BatchSize, 100)
	c.BlockTime = cmp.Or(c.BlockTime, time.Second)
	c.ClaimIdle = cmp.Or(c.ClaimIdle, brokers.DefaultClaimIdle)
	c.ClaimInterval = cmp.Or(c.ClaimInterval, max(c.ClaimIdle/4, 10*time.Millisecond))
	c.NackResendSleep = cmp.Or(c.NackResendSleep, time.Second)
	c.OldestID = cmp.Or(c.OldestID, "0")
	if c.Unmarshaller == nil {
		c.Unmarshaller = redisstream.DefaultMarshallerUnmarshaller{}
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

func (c *SubscriberConfig) validate() error {
	var errs configcheck.Errors
	check := errs.Check
	check(c.Client != nil, "Client", "is required")
	check(c.ConsumerGroup != "", "ConsumerGroup", "is required")
	check(c.Consumer != "", "Consumer", "is required")
	check(c.BatchSize >= 1, "BatchSize", "must be at least 1")
	check(c.BlockTime >= 0, "BlockTime", "must not be negative")
	check(c.ClaimIdle >= 0, "ClaimIdle", "must not be negative")
	check(c.ClaimInterval >= 0, "ClaimInterval", "must not be negative")
	check(c.NackResendSleep >= 0, "NackResendSleep", "must not be negative")
	return errs.Err("redis subscriber config")
}

// Subscriber is a Watermill subscriber on Redis Streams consumer groups
// that delivers a whole read at once: up to BatchSize messages are in
// flight together, so a handler that batches (the idempotency middleware
// shares one transaction among the messages it handles at the same time)
// can. watermill-redisstream's subscriber reads one entry at a time and
// waits for its acknowledgement before the next, which bounds a consumer
// by one transaction per message.
//
// What it guarantees: an entry is acknowledged (XACK) only after its
// message was acked; a nacked message is delivered again after
// NackResendSleep; entries left unacknowledged by a consumer that died are
// claimed (XAUTOCLAIM) after ClaimIdle; a restarted consumer of the same
// name first gets its own unacknowledged entries back. Messages of one read
// are handled concurrently, so order within a read is not kept: behind the
// idempotency middleware, aggregate versions restore it. The next read
// starts when every message of the previous one is acked.
type Subscriber struct {
	cfg SubscriberConfig

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber validates cfg. It starts nothing: Subscribe does.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Subscriber{cfg: cfg, closing: make(chan struct{})}, nil
}

// Subscribe creates the consumer group on the stream named topic if it is
// missing and delivers its entries until ctx is done or Close is called;
// the channel is closed then.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	select {
	case <-s.closing:
		return nil, errors.New("redis subscriber: closed")
	default:
	}
	if err := s.createGroup(ctx, topic); err != nil {
		return nil, err
	}
	return subloop.Start(ctx, s.closing, &s.wg, func(ctx context.Context, out chan<- *message.Message) {
		s.consume(ctx, topic, out)
	}), nil
}

// createGroup creates the consumer group, and the stream, if missing.
func (s *Subscriber) createGroup(ctx context.Context, stream string) error {
	err := s.cfg.Client.XGroupCreateMkStream(ctx, stream, s.cfg.ConsumerGroup, s.cfg.OldestID).Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("redis subscriber: create consumer group %q on %q: %w", s.cfg.ConsumerGroup, stream, err)
	}
	return nil
}

// groupLost reports whether err says the stream or its consumer group is
// gone: Redis lost its data (a flush, a restart without persistence, a
// failover to an empty replica) or someone deleted them. A blocked read
// whose stream is deleted is woken with UNBLOCKED.
func groupLost(err error) bool {
	var rerr goredis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "NOGROUP") || strings.HasPrefix(msg, "UNBLOCKED")
}

// Close stops every subscription and waits for them; messages in flight
// are not acknowledged and will be delivered again. It is safe to call more
// than once.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() { close(s.closing) })
	s.wg.Wait()
	return nil
}

func (s *Subscriber) consume(ctx context.Context, stream string, out chan<- *message.Message) {
	fields := watermill.LogFields{"stream": stream, "consumer_group": s.cfg.ConsumerGroup, "consumer": s.cfg.Consumer}
	var (
		own       = true // first deliver what this consumer name left unacknowledged
		claimFrom = "0-0"
		nextClaim time.Time
		failures  int
	)
	for ctx.Err() == nil {
		var (
			entries []goredis.XMessage
			err     error
		)
		switch {
		case time.Now().After(nextClaim):
			var cursor string
			entries, cursor, err = s.cfg.Client.XAutoClaim(ctx, &goredis.XAutoClaimArgs{
				Stream: stream, Group: s.cfg.ConsumerGroup, Consumer: s.cfg.Consumer,
				MinIdle: s.cfg.ClaimIdle, Start: claimFrom, Count: int64(s.cfg.BatchSize),
			}).Result()
			if err == nil {
				claimFrom = cursor
				if cursor == "0-0" {
					nextClaim = time.Now().Add(s.cfg.ClaimInterval)
				}
				if len(entries) > 0 {
					s.cfg.Logger.Info("claimed idle entries", fields.Add(watermill.LogFields{"entries": len(entries)}))
				}
			}
		default:
			id := ">"
			if own {
				id = "0"
			}
			var res []goredis.XStream
			res, err = s.cfg.Client.XReadGroup(ctx, &goredis.XReadGroupArgs{
				Group: s.cfg.ConsumerGroup, Consumer: s.cfg.Consumer, Streams: []string{stream, id},
				Count: int64(s.cfg.BatchSize), Block: s.cfg.BlockTime,
			}).Result()
			if errors.Is(err, goredis.Nil) {
				err = nil
			}
			if err == nil && len(res) > 0 {
				entries = res[0].Messages
			}
			if err == nil && own && len(entries) == 0 {
				own = false
			}
		}
		if err != nil && groupLost(err) && ctx.Err() == nil {
			// The group went with the data: create it again, where a new
			// group starts (OldestID), so that what the forwarder publishes
			// again after its audit finds the loss is read. This consumer's
			// pending entries went too: nothing of its own to read first.
			s.cfg.Logger.Info("consumer group missing: creating it again", fields.Add(watermill.LogFields{"error": err.Error()}))
			if err = s.createGroup(ctx, stream); err == nil {
				own, claimFrom, nextClaim = false, "0-0", time.Time{}
				continue
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			s.cfg.Logger.Error("read stream", err, fields)
			if !subloop.Sleep(ctx, backoff.Reconnect(failures)) {
				return
			}
			continue
		}
		failures = 0
		s.deliver(ctx, stream, entries, out, fields)
	}
}

type inFlight struct {
	id  string
	msg *message.Message
}

// deliver sends every entry's message at once, collects their acks and
// nacks as they come (each message's context is cancelled when it is
// settled), acks the acked ones in one XACK and sends the nacked ones again.
func (s *Subscriber) deliver(ctx context.Context, stream string, entries []goredis.XMessage, out chan<- *message.Message, fields watermill.LogFields) {
	var (
		batch []inFlight
		acked []string
	)
	for _, e := range entries {
		if e.Values == nil { // pending, but trimmed from the stream: nothing to deliver
			acked = append(acked, e.ID)
			continue
		}
		msg, err := s.cfg.Unmarshaller.Unmarshal(e.Values)
		if err != nil {
			// Not a Watermill entry: no redelivery could decode it.
			s.cfg.Logger.Error("undecodable entry acknowledged and dropped", err, fields.Add(watermill.LogFields{"xid": e.ID}))
			acked = append(acked, e.ID)
			continue
		}
		batch = append(batch, inFlight{id: e.ID, msg: msg})
	}
	type settled struct {
		i  int
		ok bool
	}
	for len(batch) > 0 {
		results := make(chan settled, len(batch))
		// drain takes the acks already given when the subscription stops,
		// so that they are sent with the stop's XACK rather than delivered
		// again: a select on a stopped ctx and a ready result picks either.
		var watching sync.WaitGroup
		drain := func() {
			watching.Wait() // ctx is done: each watcher ends at once
			for {
				select {
				case r := <-results:
					if r.ok {
						acked = append(acked, batch[r.i].id)
					}
				default:
					return
				}
			}
		}
		collect := func(n int) (nacked []inFlight, complete bool) {
			for ; n > 0; n-- {
				select {
				case r := <-results:
					if r.ok {
						acked = append(acked, batch[r.i].id)
					} else {
						nacked = append(nacked, inFlight{id: batch[r.i].id, msg: batch[r.i].msg.Copy()})
					}
				case <-ctx.Done():
					drain()
					return nil, false
				}
			}
			return nacked, true
		}
		for i, f := range batch {
			mctx, cancel := context.WithCancel(ctx)
			f.msg.SetContext(mctx)
			watching.Go(func() {
				select {
				case <-f.msg.Acked():
					results <- settled{i, true}
				case <-f.msg.Nacked():
					results <- settled{i, false}
				case <-mctx.Done():
					// Stopping: an ack given just before still counts.
					select {
					case <-f.msg.Acked():
						results <- settled{i, true}
					default:
					}
				}
				cancel()
			})
			select {
			case out <- f.msg:
			case <-ctx.Done():
				drain()
				s.ack(ctx, stream, acked, fields)
				return
			}
		}
		nacked, complete := collect(len(batch))
		if !complete {
			s.ack(ctx, stream, acked, fields)
			return
		}
		s.ack(ctx, stream, acked, fields)
		acked = nil
		batch = nacked
		if len(batch) > 0 && !subloop.Sleep(ctx, s.cfg.NackResendSleep) {
			return
		}
	}
	s.ack(ctx, stream, acked, fields)
}

// ack acknowledges ids, retrying until it succeeds or the subscription
// stops: an entry left unacknowledged is only delivered again, which the
// consumers' deduplication absorbs.
func (s *Subscriber) ack(ctx context.Context, stream string, ids []string, fields watermill.LogFields) {
	if len(ids) == 0 {
		return
	}
	// Acks of messages already handled are worth sending even while the
	// subscription stops.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for attempt := 1; ; attempt++ {
		err := s.cfg.Client.XAck(actx, stream, s.cfg.ConsumerGroup, ids...).Err()
		if err == nil {
			return
		}
		if ctx.Err() != nil || actx.Err() != nil {
			s.cfg.Logger.Error("ack entries; they will be delivered again", err, fields.Add(watermill.LogFields{"entries": len(ids)}))
			return
		}
		if !subloop.Sleep(ctx, backoff.Delay(100*time.Millisecond, time.Second, attempt)) {
			return
		}
	}
}
