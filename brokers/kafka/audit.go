package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/outflow-dev/outflow/forwarder"
)

var _ forwarder.Auditor = kafkaBroker{}

// The audit of a Kafka topic compares, per partition, the high watermark
// and the log start offset with the last audit's, and the topic's id
// (KIP-516, metadata v10+, Kafka 2.8+) with the last one:
//
//   - a topic missing, or with another id, was deleted (and recreated):
//     everything it held is gone;
//   - a high watermark that went back is a truncation: an unclean leader
//     election, a log restored from an older copy;
//   - fewer partitions, or a log start offset that went back, are a topic
//     recreated, for brokers that give no topic id;
//   - a log start offset that moved forward is retention or DeleteRecords,
//     normal trimming: never a loss.
//
// Since. Kafka records carry no broker-side time the audit can read
// without fetching them, and a lost record cannot be fetched at all, so
// the state keeps a short history of samples, (audit time, per-partition
// high watermark): a record at offset >= H was acknowledged after the
// newest sample whose watermark was <= H. The consumer groups' committed
// offsets are cheap to read (one OffsetFetch per group), so, as the Redis
// and NATS audits use the oldest entry not acknowledged, each partition's
// floor is the lowest committed offset over the groups reading the topic
// (the log start offset when none does, or for a group with no offset on
// the partition: where a new group starts), and its time is taken from the
// samples, or, when the floor predates every sample (a backlog older than
// the history), from the record at the floor (one fetch). A loss starts at
// the latest of the two bounds that hold: the floor's time (what every
// group had consumed is not needed) and, for a truncation to H, the time
// of H. Republishing more rows is harmless (consumers deduplicate); a row
// missed is an event lost, so every bound errs early: the forwarder's
// clock is taken before the broker is asked, and Config.AuditMargin covers
// published_at being taken before the write.

// auditVersion is the version of auditState; a state of another version
// is a new baseline.
const auditVersion = 1

// maxSamples bounds the history: a sample is added only when a watermark
// moved, so at the default 20 s interval 64 samples cover at least 21 min
// of steady writes, and any time of none.
const maxSamples = 64

// auditState is what one audit of a Kafka topic leaves for the next: the
// forwarder keeps it in PostgreSQL, opaque.
type auditState struct {
	V int `json:"v"`
	// Exists says the topic existed. ID is its topic id, "" when the
	// broker gives none.
	Exists bool   `json:"e,omitempty"`
	ID     string `json:"id,omitempty"`
	// Parts is indexed by partition id.
	Parts []partState `json:"p,omitempty"`
	// Samples, oldest first, are the history the times of offsets are
	// taken from; reset when the topic is recreated.
	Samples []sample `json:"s,omitempty"`
}

type partState struct {
	High  int64 `json:"h"` // high watermark
	Start int64 `json:"s"` // log start offset
	// Floor (Unix ms, the forwarder's clock) is the time from which the
	// partition's records were not consumed by every group: what a loss
	// found next time may have taken, and some group still needs, was
	// acknowledged after it.
	Floor int64 `json:"f"`
}

type sample struct {
	At   int64   `json:"t"` // Unix ms, the forwarder's clock
	High []int64 `json:"h"` // by partition id; a partition past the end had none
}

// sampleTime is the time of the newest sample whose high watermark of
// partition p was at most offset (a record at offset was acknowledged
// after it), and false when every sample is past offset.
func sampleTime(samples []sample, p int, offset int64) (int64, bool) {
	for i := len(samples) - 1; i >= 0; i-- {
		s := samples[i]
		h := int64(0)
		if p < len(s.High) {
			h = s.High[p]
		}
		if h <= offset {
			return s.At, true
		}
	}
	return 0, false
}

// addSample appends (at, high) to samples, bounded by maxSamples. When no
// watermark moved since the newest sample, that one only takes the later
// time: the bound it gives is tighter and still true.
func addSample(samples []sample, at int64, high []int64) []sample {
	if n := len(samples); n > 0 && slices.Equal(samples[n-1].High, high) {
		out := slices.Clone(samples)
		out[n-1].At = at
		return out
	}
	out := append(slices.Clone(samples), sample{At: at, High: slices.Clone(high)})
	if len(out) > maxSamples {
		out = out[len(out)-maxSamples:]
	}
	return out
}

// observed is one look at a Kafka topic.
type observed struct {
	exists bool
	id     string
	high   []int64 // by partition id
	start  []int64
	// leaders are the brokers leading the partitions, by partition id.
	leaders map[*sarama.Broker][]int32
}

// decide is the audit's judgement: the reason of a loss and the time it
// starts, or "" when the topic holds everything prev had seen. The log
// start offset moving forward (retention, DeleteRecords) is never a loss.
func decide(prev *auditState, o observed) (string, time.Time) {
	if prev == nil || !prev.Exists {
		// A baseline, or the topic did not exist at the last audit:
		// whatever it holds now was written since.
		return "", time.Time{}
	}
	whole := func() time.Time {
		var floor int64
		for i, p := range prev.Parts {
			if i == 0 || p.Floor < floor {
				floor = p.Floor
			}
		}
		return time.UnixMilli(floor)
	}
	switch {
	case !o.exists:
		return fmt.Sprintf("topic missing, its partitions had offsets up to %v", highs(prev.Parts)), whole()
	case prev.ID != "" && o.id != "" && o.id != prev.ID:
		return fmt.Sprintf("topic recreated (id %s, was %s), its partitions had offsets up to %v", o.id, prev.ID, highs(prev.Parts)), whole()
	case len(o.high) < len(prev.Parts):
		return fmt.Sprintf("partitions went from %d to %d: topic recreated", len(prev.Parts), len(o.high)), whole()
	}
	// Without topic ids (a broker before 2.8, or KafkaConfig.Version set
	// below it) a recreation shows only in offsets, and only on some
	// partitions (one the new topic already wrote past the old offsets
	// looks as it was): any offset going back may be one, and puts back
	// the whole topic. With ids, the same id is the same topic: a log start
	// offset seen lower is a new leader's that has not applied retention
	// yet, not a loss, and a high watermark lower is a truncation of that
	// partition alone.
	ids := prev.ID != "" && o.id != ""
	var (
		reasons []string
		since   time.Time
	)
	for i, p := range prev.Parts {
		var (
			reason string
			from   = time.UnixMilli(p.Floor)
		)
		switch {
		case !ids && o.start[i] < p.Start:
			return fmt.Sprintf("partition %d's log start offset went back from %d to %d: topic recreated", i, p.Start, o.start[i]), whole()
		case !ids && o.high[i] < p.High:
			return fmt.Sprintf("partition %d's high watermark went back from %d to %d (without topic ids, a truncation and a recreation look alike)",
				i, p.High, o.high[i]), whole()
		case o.start[i] < p.Start:
			continue
		case o.high[i] < p.High:
			reason = fmt.Sprintf("partition %d's high watermark went back from %d to %d", i, p.High, o.high[i])
			// Only records from the new watermark are gone.
			if at, ok := sampleTime(prev.Samples, i, o.high[i]); ok && at > p.Floor {
				from = time.UnixMilli(at)
			}
		default:
			continue
		}
		reasons = append(reasons, reason)
		if since.IsZero() || from.Before(since) {
			since = from
		}
	}
	return strings.Join(reasons, "; "), since
}

func highs(parts []partState) []int64 {
	out := make([]int64, len(parts))
	for i, p := range parts {
		out[i] = p.High
	}
	return out
}

// floorTime is the time from which partition p's records, from offset
// floor on, were acknowledged: now when every record was consumed (a record
// acknowledged later is newer), else the newest sample at or below floor;
// false when no sample reaches back that far.
func floorTime(samples []sample, p int, floor, high int64, now int64) (int64, bool) {
	if floor >= high {
		return now, true
	}
	return sampleTime(samples, p, floor)
}

// Topics is the outbox topic's one Kafka topic: [forwarder.Auditor].
func (kb kafkaBroker) Topics(topic string) []string { return kb.b.Topics(topic) }

// BrokerTopic is the Kafka topic of every row of topic, whatever its
// aggregate: [forwarder.Auditor]. A truncated partition makes the repair
// put back the rows of every partition since Since; consumers deduplicate.
func (kb kafkaBroker) BrokerTopic(topic, _ string) string { return kb.b.kafkaTopic(topic) }

// Audit compares the Kafka topic name with prev (see [forwarder.Auditor]):
// a metadata request (the topic's id and partitions, no auto-creation),
// two ListOffsets per partition leader (high watermarks, log start
// offsets), a ListGroups per broker and an OffsetFetch per consumer group
// of the backend's prefix, and a one-batch fetch per partition only when
// its floor predates the history. A topic found missing after it existed
// is created again with the backend's settings, so that the repair's
// publishes find it with its partitions (an auto-created topic would have
// the broker's default count).
func (kb kafkaBroker) Audit(ctx context.Context, name string, prev []byte) ([]byte, *forwarder.Loss, error) {
	b := kb.b
	var st *auditState
	if len(prev) > 0 {
		st = new(auditState)
		if err := json.Unmarshal(prev, st); err != nil || st.V != auditVersion {
			st = nil // unreadable: a new baseline, as for a lost state
		}
	}
	fail := func(err error) ([]byte, *forwarder.Loss, error) {
		return nil, nil, fmt.Errorf("kafka audit %s: %w", name, err)
	}
	now := time.Now().UnixMilli() // before the look: every bound errs early
	var o observed
	err := withContext(ctx, func() (err error) {
		o, err = b.observe(name)
		return err
	})
	if err != nil {
		return fail(err)
	}
	reason, since := decide(st, o)

	next := auditState{V: auditVersion, Exists: o.exists, ID: o.id}
	if o.exists {
		if st != nil && st.Exists && reason == "" {
			next.Samples = st.Samples
		}
		next.Samples = addSample(next.Samples, now, o.high)
		floors, err := b.groupFloors(ctx, name, o)
		if err != nil {
			return fail(err)
		}
		next.Parts = make([]partState, len(o.high))
		unplaced := map[int32]int64{} // partition -> floor older than every sample
		for p := range o.high {
			t, ok := floorTime(next.Samples, p, floors[p], o.high[p], now)
			if !ok {
				unplaced[int32(p)] = floors[p]
			}
			next.Parts[p] = partState{High: o.high[p], Start: o.start[p], Floor: t}
		}
		if len(unplaced) > 0 {
			var times map[int32]time.Time
			err := withContext(ctx, func() (err error) {
				times, err = b.recordTimes(name, o, unplaced)
				return err
			})
			if err != nil {
				return fail(err)
			}
			for p := range unplaced {
				// Zero when the record was trimmed meanwhile: the
				// epoch, everything retained, errs early.
				next.Parts[p].Floor = min(max(times[p].UnixMilli(), 0), now)
			}
		}
	} else if st != nil && st.Exists {
		// Created again for the repair; the next audit takes the new
		// topic as its baseline.
		if err := withContext(ctx, func() error { return b.createTopic(name) }); err != nil {
			return fail(err)
		}
	}
	raw, err := json.Marshal(next)
	if err != nil {
		return fail(err)
	}
	if reason == "" {
		return raw, nil, nil
	}
	return raw, &forwarder.Loss{Since: since, Reason: reason}, nil
}

// observe reads the topic's id, partitions, high watermarks and log start
// offsets.
func (b *kafkaBackend) observe(name string) (observed, error) {
	meta, id, err := b.describeTopic(name)
	if err != nil || !id.exists {
		return observed{}, err
	}
	o := observed{exists: true, id: id.id}
	n := 0
	byLeader := map[int32][]int32{}
	for _, p := range meta.Partitions {
		n = max(n, int(p.ID)+1)
		byLeader[p.Leader] = append(byLeader[p.Leader], p.ID)
	}
	if n != len(meta.Partitions) {
		return observed{}, fmt.Errorf("describe topic: partitions %d of ids up to %d", len(meta.Partitions), n-1)
	}
	o.high, o.start = make([]int64, n), make([]int64, n)
	o.leaders = map[*sarama.Broker][]int32{}
	for leader, parts := range byLeader {
		broker, err := b.client.Broker(leader)
		if errors.Is(err, sarama.ErrBrokerNotFound) {
			// A broker the client does not know yet: the partition's
			// leader per the client's own (refreshed) metadata.
			broker, err = b.client.Leader(name, parts[0])
		}
		if err != nil {
			return observed{}, fmt.Errorf("leader %d of partitions %v: %w", leader, parts, err)
		}
		o.leaders[broker] = parts
		for _, at := range []struct {
			ts  int64
			out []int64
		}{{sarama.OffsetNewest, o.high}, {sarama.OffsetOldest, o.start}} {
			req := sarama.NewOffsetRequest(b.client.Config().Version)
			for _, p := range parts {
				req.AddBlock(name, p, at.ts, 1)
			}
			resp, err := broker.GetAvailableOffsets(req)
			if err != nil {
				return observed{}, fmt.Errorf("list offsets: %w", err)
			}
			for _, p := range parts {
				blk := resp.GetBlock(name, p)
				switch {
				case blk == nil:
					return observed{}, fmt.Errorf("list offsets: partition %d: %w", p, sarama.ErrIncompleteResponse)
				case !errors.Is(blk.Err, sarama.ErrNoError):
					return observed{}, fmt.Errorf("list offsets: partition %d: %w", p, blk.Err)
				case req.Version == 0 && len(blk.Offsets) == 1:
					at.out[p] = blk.Offsets[0]
				default:
					at.out[p] = blk.Offset
				}
			}
		}
	}
	return o, nil
}

// topicIdentity tells one incarnation of a topic from the next: the audit
// and the subscriptions' watch (subscriber.go) read it the same way.
type topicIdentity struct {
	exists bool
	id     string // "" when the broker gives none (before Kafka 2.8)
}

// describeTopic is one metadata request for name, which does not create
// it: its metadata (nil when it does not exist) and identity.
func (b *kafkaBackend) describeTopic(name string) (*sarama.TopicMetadata, topicIdentity, error) {
	meta, err := b.admin.DescribeTopics([]string{name})
	if err != nil {
		return nil, topicIdentity{}, fmt.Errorf("describe topic: %w", err)
	}
	if len(meta) != 1 || errors.Is(meta[0].Err, sarama.ErrUnknownTopicOrPartition) {
		return nil, topicIdentity{}, nil
	}
	if !errors.Is(meta[0].Err, sarama.ErrNoError) {
		return nil, topicIdentity{}, fmt.Errorf("describe topic: %w", meta[0].Err)
	}
	id := topicIdentity{exists: true}
	if meta[0].Uuid != (sarama.Uuid{}) {
		id.id = meta[0].Uuid.String()
	}
	return meta[0], id, nil
}

// groupFloors is, per partition of o, the lowest offset some consumer
// group of the backend's prefix has not consumed: the lowest committed
// offset over the groups with a committed offset on the topic (a group
// without one on a partition reads it from the log start, as a new group
// does), the log start offset when no group reads the topic. Groups
// outside the prefix are not Outflow's and are not counted.
func (b *kafkaBackend) groupFloors(ctx context.Context, name string, o observed) ([]int64, error) {
	floors := slices.Clone(o.high)
	parts := make([]int32, len(o.high))
	for i := range parts {
		parts[i] = int32(i)
	}
	err := withContext(ctx, func() error {
		groups, err := b.admin.ListConsumerGroups()
		if err != nil {
			return fmt.Errorf("list consumer groups: %w", err)
		}
		read := false
		for g := range groups {
			if !strings.HasPrefix(g, b.cfg.Kafka.TopicPrefix) {
				continue
			}
			resp, err := b.admin.ListConsumerGroupOffsets(g, map[string][]int32{name: parts})
			switch {
			case errors.Is(err, sarama.ErrGroupIDNotFound):
				continue // gone meanwhile, or no offsets yet (kfake)
			case err != nil:
				return fmt.Errorf("offsets of group %s: %w", g, err)
			}
			committed := make([]int64, len(parts))
			reads := false
			for i, p := range parts {
				committed[i] = -1
				if blk := resp.GetBlock(name, p); blk != nil && errors.Is(blk.Err, sarama.ErrNoError) {
					committed[i] = blk.Offset
				}
				reads = reads || committed[i] >= 0
			}
			if !reads {
				continue // a group of other topics
			}
			read = true
			for i, c := range committed {
				if c < 0 {
					c = o.start[i]
				}
				floors[i] = min(floors[i], c)
			}
		}
		if !read {
			copy(floors, o.start)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := range floors {
		floors[i] = max(floors[i], o.start[i])
	}
	return floors, nil
}

// recordTimes fetches the timestamp of the record at (or the first after)
// each partition's offset in at: one fetch request per partition (a broker
// returns the first batch of a request's first partition whole, however
// small the limit asked, and only that one), whose answer is the one
// record batch holding the offset. A partition whose record is gone
// (trimmed meanwhile) gets no time.
func (b *kafkaBackend) recordTimes(name string, o observed, at map[int32]int64) (map[int32]time.Time, error) {
	times := map[int32]time.Time{}
	if !b.client.Config().Version.IsAtLeast(sarama.V0_11_0_0) {
		return times, nil // no record batches to read timestamps from: the epoch
	}
	for broker, parts := range o.leaders {
		for _, p := range parts {
			off, ok := at[p]
			if !ok {
				continue
			}
			req := &sarama.FetchRequest{Version: 4, MinBytes: 1, MaxWaitTime: 100, MaxBytes: 1, Isolation: sarama.ReadUncommitted}
			req.AddBlock(name, p, off, 1, -1)
			resp, err := broker.Fetch(req)
			if err != nil {
				return nil, fmt.Errorf("fetch partition %d's offset %d: %w", p, off, err)
			}
			blk := resp.GetBlock(name, p)
			switch {
			case blk == nil:
				return nil, fmt.Errorf("fetch partition %d: %w", p, sarama.ErrIncompleteResponse)
			case errors.Is(blk.Err, sarama.ErrOffsetOutOfRange):
				continue
			case !errors.Is(blk.Err, sarama.ErrNoError):
				return nil, fmt.Errorf("fetch partition %d: %w", p, blk.Err)
			}
			times[p] = firstTimeFrom(blk.RecordsSet, off)
		}
	}
	return times, nil
}

// firstTimeFrom is the timestamp of the first record at or after offset in
// sets, zero when there is none.
func firstTimeFrom(sets []*sarama.Records, offset int64) time.Time {
	for _, rs := range sets {
		batch := rs.RecordBatch
		if batch == nil || batch.Control {
			continue
		}
		for _, r := range batch.Records {
			if batch.FirstOffset+r.OffsetDelta < offset {
				continue
			}
			if batch.LogAppendTime {
				return batch.MaxTimestamp
			}
			return batch.FirstTimestamp.Add(r.TimestampDelta)
		}
	}
	return time.Time{}
}

// createTopic creates name with the backend's settings, unless it exists.
func (b *kafkaBackend) createTopic(name string) error {
	err := b.admin.CreateTopic(name, &sarama.TopicDetail{
		NumPartitions: b.cfg.Kafka.TopicPartitions, ReplicationFactor: b.cfg.Kafka.ReplicationFactor,
	}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("create Kafka topic %q: %w", name, err)
	}
	return nil
}
