package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/outflow-dev/outflow/brokers"
)

var (
	_ brokers.LagReporter = (*kafkaBackend)(nil)
	_ brokers.Pinger      = (*kafkaBackend)(nil)
)

// Ping asks the controller for the cluster's metadata.
func (b *kafkaBackend) Ping(ctx context.Context) error {
	err := withContext(ctx, func() error {
		_, _, err := b.admin.DescribeCluster()
		return err
	})
	if err != nil {
		return fmt.Errorf("kafka ping: %w", err)
	}
	return nil
}

// Lag sums, over topic's partitions, the records past the group's
// committed offset (the next record it will read) up to the partition's
// end offset; a partition the group has no offset for lags from its oldest
// record, where a new group starts (Consumer.Offsets.Initial). The oldest
// age is the timestamp of the first record past the committed offset,
// fetched from each lagging partition. Records delivered to a consumer and
// not committed yet count as lagging: the committed offset moves with the
// acks, once a second. It only reads: a topic not created yet lags by
// nothing and is not created (a metadata request without auto-creation),
// and no group is joined.
func (b *kafkaBackend) Lag(ctx context.Context, group, topic string) (brokers.Lag, error) {
	name := b.kafkaTopic(topic)
	fail := func(err error) (brokers.Lag, error) {
		return brokers.Lag{}, fmt.Errorf("kafka lag of %s on %s: %w", group, name, err)
	}
	var lag brokers.Lag
	err := withContext(ctx, func() error {
		meta, id, err := b.describeTopic(name)
		if err != nil || !id.exists {
			return err
		}
		parts := make([]int32, len(meta.Partitions))
		for i, p := range meta.Partitions {
			parts[i] = p.ID
		}
		committed, err := b.admin.ListConsumerGroupOffsets(b.cfg.Kafka.TopicPrefix+group, map[string][]int32{name: parts})
		switch {
		case errors.Is(err, sarama.ErrGroupIDNotFound) || committed != nil && errors.Is(committed.Err, sarama.ErrGroupIDNotFound):
			committed = nil // kfake's answer for a group with no offsets yet (Kafka's: offset -1)
		case err != nil:
			return err
		case committed.Err != sarama.ErrNoError:
			return committed.Err
		}
		var oldest time.Time
		for _, p := range parts {
			end, err := b.client.GetOffset(name, p, sarama.OffsetNewest)
			if err != nil {
				return err
			}
			from := int64(-1)
			if blk := committedBlock(committed, name, p); blk != nil {
				if blk.Err != sarama.ErrNoError {
					return blk.Err
				}
				from = blk.Offset
			}
			if from < 0 {
				if from, err = b.client.GetOffset(name, p, sarama.OffsetOldest); err != nil {
					return err
				}
			}
			if end <= from {
				continue
			}
			lag.Events += end - from
			t, err := b.recordTime(ctx, name, p, from)
			if err != nil {
				return err
			}
			if !t.IsZero() && (oldest.IsZero() || t.Before(oldest)) {
				oldest = t
			}
		}
		if lag.Events > 0 && !oldest.IsZero() {
			lag.OldestAge = max(time.Since(oldest), 0)
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	return lag, nil
}

func committedBlock(r *sarama.OffsetFetchResponse, topic string, p int32) *sarama.OffsetFetchResponseBlock {
	if r == nil {
		return nil
	}
	return r.GetBlock(topic, p)
}

// recordTime fetches the record at offset of topic's partition p and
// returns its timestamp (zero when the record format has none): one fetch
// by a partition consumer outside any group, which commits nothing.
func (b *kafkaBackend) recordTime(ctx context.Context, topic string, p int32, offset int64) (time.Time, error) {
	c, err := sarama.NewConsumerFromClient(b.client)
	if err != nil {
		return time.Time{}, err
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, p, offset)
	if errors.Is(err, sarama.ErrOffsetOutOfRange) {
		return time.Time{}, nil // deleted by retention meanwhile
	}
	if err != nil {
		return time.Time{}, err
	}
	defer pc.AsyncClose()
	select {
	case m := <-pc.Messages():
		return m.Timestamp, nil
	case err := <-pc.Errors():
		return time.Time{}, err
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// withContext runs f, whose sarama calls take no context, and returns when
// ctx is done even if f has not (f then ends on sarama's own timeouts).
func withContext(ctx context.Context, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
