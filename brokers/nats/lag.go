package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outflow-dev/outflow/brokers"
)

var (
	_ brokers.LagReporter = (*natsBackend)(nil)
	_ brokers.Pinger      = (*natsBackend)(nil)
)

// Ping asks the server for the account's JetStream usage: a round trip
// that JetStream itself answers, not only the core server.
func (b *natsBackend) Ping(ctx context.Context) error {
	if _, err := b.js.AccountInfo(nats.Context(ctx)); err != nil {
		return fmt.Errorf("nats ping: %w", err)
	}
	return nil
}

// Lag sums, over topic's subjects, what group's durable consumer of each
// has not had acked: NumPending (not delivered yet) plus NumAckPending
// (delivered, not acked). The oldest age is the stored time of the first
// message of the subject after the consumer's ack floor. A consumer not
// created yet will start at the subject's first message, so the subject's
// every message lags; a stream not created yet lags by nothing. It only
// reads (consumer and stream info, a message get): it creates nothing.
func (b *natsBackend) Lag(ctx context.Context, group, topic string) (brokers.Lag, error) {
	var (
		lag    brokers.Lag
		oldest time.Time
	)
	for _, subject := range b.Topics(topic) {
		stream := streamName(b.streamTopic(subject))
		durable := group + "_" + streamName(subject)
		fail := func(err error) (brokers.Lag, error) {
			return brokers.Lag{}, fmt.Errorf("nats lag of %s on %s: %w", group, subject, err)
		}
		var from uint64 // the first stream sequence not handled
		info, err := b.js.ConsumerInfo(stream, durable, nats.Context(ctx))
		switch {
		case errors.Is(err, nats.ErrStreamNotFound):
			continue
		case errors.Is(err, nats.ErrConsumerNotFound):
			si, err := b.js.StreamInfo(stream, &nats.StreamInfoRequest{SubjectsFilter: subject}, nats.Context(ctx))
			if errors.Is(err, nats.ErrStreamNotFound) {
				continue
			}
			if err != nil {
				return fail(err)
			}
			n := si.State.Subjects[subject]
			if n == 0 {
				continue
			}
			lag.Events += int64(n)
			from = si.State.FirstSeq
		case err != nil:
			return fail(err)
		default:
			n := int64(info.NumPending) + int64(info.NumAckPending)
			if n == 0 {
				continue
			}
			lag.Events += n
			from = info.AckFloor.Stream + 1
		}
		t, err := b.nextTime(ctx, stream, subject, from)
		if err != nil {
			return fail(err)
		}
		if !t.IsZero() && (oldest.IsZero() || t.Before(oldest)) {
			oldest = t
		}
	}
	if lag.Events > 0 && !oldest.IsZero() {
		lag.OldestAge = max(time.Since(oldest), 0)
	}
	return lag, nil
}

// nextTime is the stored time of subject's first message in stream at or
// after sequence seq; zero when there is none. nats.go offers "next by
// subject" only over direct gets (a stream option, off by default), so
// this sends the JetStream API's message get itself.
func (b *natsBackend) nextTime(ctx context.Context, stream, subject string, seq uint64) (time.Time, error) {
	req, err := json.Marshal(struct {
		Seq     uint64 `json:"seq"`
		NextFor string `json:"next_by_subj"`
	}{max(seq, 1), subject})
	if err != nil {
		return time.Time{}, err
	}
	msg, err := b.conn.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return time.Time{}, fmt.Errorf("get the message after %d: %w", seq, err)
	}
	var resp struct {
		Message *struct {
			Time time.Time `json:"time"`
		} `json:"message"`
		Error *nats.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return time.Time{}, fmt.Errorf("get the message after %d: %w", seq, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == nats.JSErrCodeMessageNotFound:
		return time.Time{}, nil // acked or deleted meanwhile
	case resp.Error != nil:
		return time.Time{}, fmt.Errorf("get the message after %d: %w", seq, resp.Error)
	case resp.Message == nil:
		return time.Time{}, nil
	}
	return resp.Message.Time, nil
}
