package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/outflow-dev/outflow/forwarder"
)

var _ forwarder.Auditor = kafkaBroker{}

// A receipt's Position is "<partition>:<offset>", as the produce request's
// answer gave them: the record's place in the Kafka topic the receipt's
// BrokerTopic names. It says nothing of the topic's incarnation (the
// produce answer carries no topic id): a topic deleted and recreated
// reuses the offsets, so Check tells a record from another at the same
// offset by its message id.

func position(partition int32, offset int64) string {
	return strconv.FormatInt(int64(partition), 10) + ":" + strconv.FormatInt(offset, 10)
}

// place is a parsed Position; ok is false for one that does not parse.
type place struct {
	p  int32
	o  int64
	ok bool
}

func parsePosition(s string) place {
	ps, offs, found := strings.Cut(s, ":")
	p, perr := strconv.ParseInt(ps, 10, 32)
	o, oerr := strconv.ParseInt(offs, 10, 64)
	if !found || perr != nil || oerr != nil || p < 0 || o < 0 {
		return place{}
	}
	return place{p: int32(p), o: o, ok: true}
}

// auditVersion is the version of auditState; a state of another version
// (the marks of the audit before receipts) is taken for none.
const auditVersion = 2

// auditState is what one Check of a Kafka topic leaves for the next: the
// forwarder keeps it in PostgreSQL, opaque.
type auditState struct {
	V int `json:"v"`
	// ID is the topic id (KIP-516) the Check saw, "" when the topic was
	// missing or the broker gives no ids. A record missing below the log
	// start of a topic whose id changed since may be the old topic's, whose
	// consumers' offsets Kafka dropped with it: nothing shows that they had
	// it.
	ID string `json:"id,omitempty"`
	// Groups are the consumer groups of the prefix with offsets on the
	// topic as Check last saw them.
	Groups []string `json:"g,omitempty"`
	// Awaited are groups whose offsets on the topic vanished with its
	// data, by when they were first missed (Unix ms): see
	// [forwarder.AwaitLostGroups].
	Awaited map[string]int64 `json:"w,omitempty"`
}

// The fetch of the held records is bounded: fetchPartitionBytes asked per
// partition and request (a broker returns at least one record batch
// whole, however small the limit), fetchBudget in all per Check. Held
// records the budget does not reach are left Unsettled, for a later audit.
// Variables for the tests.
var (
	fetchPartitionBytes int32 = 256 << 10
	fetchBudget         int64 = 64 << 20
)

// Check judges each held record of the Kafka topic name
// ([forwarder.Auditor]). It reads the topic's metadata (its id and
// partitions), the committed offsets of the consumer groups of the
// backend's prefix, each partition's log start offset and high watermark,
// and the held records themselves, compared by message id; see judge for
// the rules. A topic found missing is created again with the backend's
// partitions, so that the repair's publishes find it (a topic created by
// the broker's auto-creation would have the broker's default count).
//
// Cost: a metadata request; a ListGroups per broker and an OffsetFetch per
// group of the prefix, twice when a held record is missing; two ListOffsets
// per partition leader; Fetch requests from the lowest held offset of each
// partition, one request per leader a round, a round reading
// fetchPartitionBytes of each partition still to look at and skipping to
// the next held offset, within fetchBudget: about the held records' bytes.
func (kb kafkaBroker) Check(ctx context.Context, name string, prev []byte, held []forwarder.Held, _ bool) (forwarder.Verdict, error) {
	b := kb.b
	var st auditState
	if json.Unmarshal(prev, &st) != nil || st.V != auditVersion {
		st = auditState{} // none, or the old audit's: as for a lost state
	}
	places := make([]place, len(held))
	for i, h := range held {
		places[i] = parsePosition(h.Position)
	}
	fail := func(err error) (forwarder.Verdict, error) {
		return forwarder.Verdict{}, fmt.Errorf("kafka audit %s: %w", name, err)
	}
	var l topicLook
	err := withContext(ctx, func() (err error) {
		l, err = b.look(name, places)
		return err
	})
	if err != nil {
		return fail(err)
	}
	awaited := awaitedGroups(st, l, places, held, time.Now())
	l.await(awaited)
	status, reason := judge(st.ID, l, places, held)
	next := auditState{V: auditVersion, ID: l.id, Awaited: awaited}
	for _, g := range l.groups() {
		if _, ok := awaited[g]; !ok {
			next.Groups = append(next.Groups, g)
		}
	}
	if !l.exists {
		err := withContext(ctx, func() error {
			if err := b.createTopic(name); err != nil {
				return err
			}
			// The receipts of the next Check are the new topic's.
			_, id, err := b.describeTopic(name)
			next.ID = id.id
			return err
		})
		if err != nil {
			return fail(err)
		}
	}
	state, err := json.Marshal(next)
	if err != nil {
		return fail(err)
	}
	return forwarder.Verdict{State: state, Status: status, Reason: reason}, nil
}

// topicLook is what Check read of a Kafka topic.
type topicLook struct {
	exists bool
	id     string     // "" when the broker gives none
	parts  []partLook // by partition id
	// before are the groups' offsets read before the records were fetched:
	// what a group had consumed then, it consumed while the record found
	// was there. after are those read after, for records found missing
	// (their trim may have come after the first read); nil when no held
	// record was missing, and then before stands for them.
	before, after []groupLook
}

// partLook is what Check read of one partition.
type partLook struct {
	start, high int64 // log start offset, high watermark
	// records maps the offset of each record fetched to its message id
	// ("" when it has none).
	records map[int64]string
	// covered are the offset ranges [from, to) the fetches read whole:
	// a held offset in one that is not in records is missing from the log.
	covered []span
	// unread: the broker's record format has no headers (before Kafka
	// 0.11) or no fetch was made: a held offset in [start, high) is taken
	// for present.
	unread bool
}

type span struct{ from, to int64 }

func (pl partLook) isCovered(o int64) bool {
	return slices.ContainsFunc(pl.covered, func(s span) bool { return s.from <= o && o < s.to })
}

// groupLook is one consumer group reading the topic: for each partition,
// the next offset it reads, -1 when it has no committed offset there that
// Check trusts (it then reads from the log start, as a new group does).
type groupLook struct {
	name string
	next []int64
}

// judge is Check's decision for each held record (its place, its message
// id), and the reason of the first loss. prevID is the topic id the
// previous Check saw.
//
// Lost:
//   - the topic is missing (deleted: Kafka dropped its groups' offsets with
//     it), or the partition is;
//   - the offset is at or above the high watermark: the log was truncated
//     (an unclean leader election, a log restored from an older copy) or
//     the topic recreated and not yet written that far. A group's offset
//     past it is no proof: it is an offset in the log that was cut;
//   - the record at the offset holds another message: the topic was
//     recreated, or the log truncated and written again;
//   - below the log start offset (retention, DeleteRecords) or missing
//     inside the log (compaction), while some group had not committed past
//     it, or when the topic's id changed since the previous Check (the
//     record may be the old topic's, which every group may never have
//     read).
//
// Settled: found, with every group of the topic committed past it (at
// least one group); or gone below the log start or from inside the log
// with no group short of it (none at all counts: a group created later
// starts at the log start, and could never read it).
//
// Unsettled: found (or not fetched, beyond the budget) while some group,
// or no group yet, has not consumed it.
func judge(prevID string, l topicLook, places []place, held []forwarder.Held) ([]forwarder.Status, string) {
	status := make([]forwarder.Status, len(held))
	reason := ""
	lose := func(i int, why string) {
		status[i] = forwarder.Lost
		if reason == "" {
			reason = why
		}
	}
	after := l.after
	if after == nil {
		after = l.before
	}
	recreated := prevID != "" && l.id != "" && prevID != l.id
	for i, pl := range places {
		pos := held[i].Position
		if !pl.ok {
			lose(i, fmt.Sprintf("position %q unreadable", pos))
			continue
		}
		if !l.exists {
			lose(i, fmt.Sprintf("topic missing, record %s was acknowledged to the forwarder", pos))
			continue
		}
		if int(pl.p) >= len(l.parts) {
			lose(i, fmt.Sprintf("partition %d missing (the topic has %d): the topic was recreated", pl.p, len(l.parts)))
			continue
		}
		part := l.parts[pl.p]
		switch rec, found := part.records[pl.o]; {
		case pl.o >= part.high:
			lose(i, fmt.Sprintf("record %s at or above partition %d's high watermark %d: the log was truncated (unclean leader election, restored copy) or the topic recreated",
				pos, pl.p, part.high))
		case pl.o < part.start && recreated:
			lose(i, fmt.Sprintf("record %s below partition %d's log start offset %d, and the topic was recreated since the last audit (id %s, was %s)",
				pos, pl.p, part.start, l.id, prevID))
		case pl.o < part.start:
			if g := shortOf(after, pl, part.start); g != "" {
				lose(i, fmt.Sprintf("record %s removed below partition %d's log start offset %d (retention, DeleteRecords) before group %s consumed it",
					pos, pl.p, part.start, g))
			} else {
				status[i] = forwarder.Settled
			}
		case found && held[i].MessageID != "" && rec != "" && rec != held[i].MessageID:
			lose(i, fmt.Sprintf("record %s holds another message: the topic was recreated, or the log truncated and written again", pos))
		case found || part.unread:
			if len(l.before) > 0 && shortOf(l.before, pl, part.start) == "" {
				status[i] = forwarder.Settled
			}
		case part.isCovered(pl.o):
			if g := shortOf(after, pl, part.start); g != "" {
				lose(i, fmt.Sprintf("record %s missing from partition %d's log (compacted?) before group %s consumed it", pos, pl.p, g))
			} else {
				status[i] = forwarder.Settled
			}
		default:
			// Not fetched (beyond the budget): looked for at a later audit.
		}
	}
	return status, reason
}

// awaitedGroups returns the groups to await ([forwarder.AwaitLostGroups]):
// those of st without offsets on the topic now when the topic went
// missing or was recreated, or when the records, judged with the groups
// already awaited, show a loss. Retention of consumed records alone while
// a group was deleted on purpose (or its offsets expired) is no reason to
// hold the topic.
func awaitedGroups(st auditState, l topicLook, places []place, held []forwarder.Held, now time.Time) map[string]int64 {
	names := l.groups()
	present := func(g string) bool { return slices.Contains(names, g) }
	dataLost := !l.exists || (st.ID != "" && l.id != "" && st.ID != l.id)
	awaited := forwarder.AwaitLostGroups(st.Groups, st.Awaited, present, dataLost, now)
	if !dataLost {
		lw := l
		lw.await(awaited)
		if status, _ := judge(st.ID, lw, places, held); slices.Contains(status, forwarder.Lost) {
			awaited = forwarder.AwaitLostGroups(st.Groups, st.Awaited, present, true, now)
		}
	}
	return awaited
}

// groups names the groups the look found, before and after.
func (l topicLook) groups() []string {
	var out []string
	for _, gs := range [][]groupLook{l.before, l.after} {
		for _, g := range gs {
			if !slices.Contains(out, g.name) {
				out = append(out, g.name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// await adds the awaited groups to what the look found, each at offset 0
// of every partition: it has consumed nothing, not even what a trim
// removed.
func (l *topicLook) await(awaited map[string]int64) {
	if len(awaited) == 0 {
		return
	}
	if l.after == nil {
		l.after = slices.Clone(l.before)
	}
	for g := range awaited {
		next := make([]int64, len(l.parts))
		l.before = append(l.before, groupLook{name: g, next: next})
		l.after = append(l.after, groupLook{name: g, next: next})
	}
}

// shortOf names a group that has not consumed the record at pl (its next
// offset, or the log start for a group without one, at or below it), ""
// when every group has (or there is none).
func shortOf(groups []groupLook, pl place, start int64) string {
	for _, g := range groups {
		next := int64(-1)
		if int(pl.p) < len(g.next) {
			next = g.next[pl.p]
		}
		if next < 0 {
			next = start
		}
		if next <= pl.o {
			return g.name
		}
	}
	return ""
}

// look reads the topic: metadata, the groups' offsets, the partitions'
// offsets, the held records, and the groups' offsets again when a held
// record is missing.
func (b *kafkaBackend) look(name string, places []place) (topicLook, error) {
	meta, id, err := b.describeTopic(name)
	if err != nil || !id.exists {
		return topicLook{}, err
	}
	l := topicLook{exists: true, id: id.id}
	n := 0
	byLeader := map[int32][]int32{}
	for _, p := range meta.Partitions {
		n = max(n, int(p.ID)+1)
		byLeader[p.Leader] = append(byLeader[p.Leader], p.ID)
	}
	if n != len(meta.Partitions) {
		return topicLook{}, fmt.Errorf("describe topic: %d partitions of ids up to %d", len(meta.Partitions), n-1)
	}
	leaders := map[*sarama.Broker][]int32{}
	for leader, parts := range byLeader {
		broker, err := b.client.Broker(leader)
		if errors.Is(err, sarama.ErrBrokerNotFound) {
			// A broker the client does not know yet: the partition's
			// leader per the client's own (refreshed) metadata.
			broker, err = b.client.Leader(name, parts[0])
		}
		if err != nil {
			return topicLook{}, fmt.Errorf("leader %d of partitions %v: %w", leader, parts, err)
		}
		leaders[broker] = parts
	}
	before, err := b.groupCommits(name, n)
	if err != nil {
		return topicLook{}, err
	}
	l.parts = make([]partLook, n)
	for broker, parts := range leaders {
		if err := b.listOffsets(broker, name, parts, l.parts); err != nil {
			return topicLook{}, err
		}
	}
	want := make([][]int64, n) // the held offsets of each partition inside its log, sorted
	for _, pl := range places {
		if pl.ok && int(pl.p) < n && pl.o >= l.parts[pl.p].start && pl.o < l.parts[pl.p].high {
			want[pl.p] = append(want[pl.p], pl.o)
		}
	}
	for p := range want {
		slices.Sort(want[p])
		want[p] = slices.Compact(want[p])
	}
	if b.client.Config().Version.IsAtLeast(sarama.V0_11_0_0) {
		budget := fetchBudget
		for broker, parts := range leaders {
			if err := b.fetchHeld(broker, name, parts, want, l.parts, &budget); err != nil {
				return topicLook{}, err
			}
		}
	} else {
		for p := range l.parts {
			l.parts[p].unread = true
		}
	}
	l.before = trusted(before, l)
	missing := false
	for _, pl := range places {
		if !pl.ok || int(pl.p) >= n {
			continue
		}
		part := l.parts[pl.p]
		_, found := part.records[pl.o]
		missing = missing || pl.o < part.start || (!found && part.isCovered(pl.o))
	}
	if missing {
		after, err := b.groupCommits(name, n)
		if err != nil {
			return topicLook{}, err
		}
		l.after = trusted(after, l)
	}
	return l, nil
}

// listOffsets sets the log start offset and the high watermark of parts,
// led by broker: two ListOffsets requests.
func (b *kafkaBackend) listOffsets(broker *sarama.Broker, name string, parts []int32, out []partLook) error {
	for _, at := range []int64{sarama.OffsetNewest, sarama.OffsetOldest} {
		req := sarama.NewOffsetRequest(b.client.Config().Version)
		for _, p := range parts {
			req.AddBlock(name, p, at, 1)
		}
		resp, err := broker.GetAvailableOffsets(req)
		if err != nil {
			return fmt.Errorf("list offsets: %w", err)
		}
		for _, p := range parts {
			blk := resp.GetBlock(name, p)
			var off int64
			switch {
			case blk == nil:
				return fmt.Errorf("list offsets: partition %d: %w", p, sarama.ErrIncompleteResponse)
			case !errors.Is(blk.Err, sarama.ErrNoError):
				return fmt.Errorf("list offsets: partition %d: %w", p, blk.Err)
			case req.Version == 0 && len(blk.Offsets) == 1:
				off = blk.Offsets[0]
			default:
				off = blk.Offset
			}
			if at == sarama.OffsetNewest {
				out[p].high = off
			} else {
				out[p].start = off
			}
		}
	}
	return nil
}

// fetchHeld reads, from broker, the records of parts at the offsets of
// want, into out's records and covered: rounds of one Fetch request, each
// partition from its lowest held offset not read yet, fetchPartitionBytes
// at a time, skipping what lies between two held offsets beyond what a
// round returned. A partition whose offset is out of range (retention, a
// truncation, racing the look) has its offsets read again, and the held
// offsets outside them are judged with those.
func (b *kafkaBackend) fetchHeld(broker *sarama.Broker, name string, parts []int32, want [][]int64, out []partLook, budget *int64) error {
	next := map[int32]int{} // index in want[p] of the next offset to read
	for _, p := range parts {
		if len(want[p]) > 0 {
			next[p] = 0
			out[p].records = map[int64]string{}
		}
	}
	for len(next) > 0 && *budget > 0 {
		from := make(map[int32]int64, len(next))
		for p, k := range next {
			from[p] = want[p][k]
			*budget -= int64(fetchPartitionBytes)
		}
		got, err := b.fetchFrom(broker, name, from)
		if err != nil {
			return err
		}
		for p, f := range got {
			skip := int64(0) // the held offsets below it are read, or judged without a read
			switch {
			case errors.Is(f.err, sarama.ErrOffsetOutOfRange):
				if err := b.listOffsets(broker, name, []int32{p}, out); err != nil {
					return err
				}
			case !errors.Is(f.err, sarama.ErrNoError):
				return fmt.Errorf("fetch partition %d from %d: %w", p, from[p], f.err)
			case f.to <= from[p]:
				delete(next, p) // nothing to read there: the rest is not looked at
				continue
			default:
				maps.Copy(out[p].records, f.records)
				out[p].covered = append(out[p].covered, span{from[p], f.to})
				skip = f.to
			}
			skip = max(skip, out[p].start)
			k := next[p]
			for k < len(want[p]) && want[p][k] < skip {
				k++
			}
			if k == len(want[p]) || want[p][k] >= out[p].high {
				delete(next, p)
			} else {
				next[p] = k
			}
		}
	}
	return nil
}

// fetched is one partition's part of a Fetch answer.
type fetched struct {
	err     sarama.KError
	records map[int64]string // offset -> message id
	// to is the offset after the last one the answer accounted for (the
	// last record batch's last offset, or the last record decoded of a
	// batch cut short); the asked offset when it held none.
	to int64
}

// fetchFrom sends one Fetch request to broker for name's partitions, each
// from its offset in from.
func (b *kafkaBackend) fetchFrom(broker *sarama.Broker, name string, from map[int32]int64) (map[int32]fetched, error) {
	req := &sarama.FetchRequest{Version: 4, MinBytes: 1, MaxWaitTime: 100, MaxBytes: 8 << 20, Isolation: sarama.ReadUncommitted}
	for p, off := range from {
		req.AddBlock(name, p, off, fetchPartitionBytes, -1)
	}
	resp, err := broker.Fetch(req)
	if err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	out := make(map[int32]fetched, len(from))
	for p, off := range from {
		blk := resp.GetBlock(name, p)
		if blk == nil {
			return nil, fmt.Errorf("fetch partition %d: %w", p, sarama.ErrIncompleteResponse)
		}
		f := fetched{err: blk.Err, records: map[int64]string{}, to: off}
		for _, rs := range blk.RecordsSet {
			batch := rs.RecordBatch
			if batch == nil {
				continue
			}
			last := batch.LastOffset()
			if batch.PartialTrailingRecord {
				last = off - 1
			}
			for _, r := range batch.Records {
				o := batch.FirstOffset + r.OffsetDelta
				if !batch.Control {
					f.records[o] = headerID(r.Headers)
				}
				if batch.PartialTrailingRecord {
					last = max(last, o)
				}
			}
			f.to = max(f.to, last+1)
		}
		out[p] = f
	}
	return out, nil
}

// headerID is the watermill message id among headers, "" when none.
func headerID(headers []*sarama.RecordHeader) string {
	for _, h := range headers {
		if h != nil && string(h.Key) == kafka.UUIDHeaderKey {
			return string(h.Value)
		}
	}
	return ""
}

// groupOffsets is one group's committed offsets on the topic, by
// partition; offset -1 where it has none.
type groupOffsets struct {
	name    string
	commits []commit
}

type commit struct {
	offset int64
	meta   string // the commit's metadata: the subscriber's stamp
}

// groupCommits reads the committed offsets on name's n partitions of every
// consumer group of the backend's prefix that has one on the topic: a
// ListGroups per broker, an OffsetFetch per group. Groups outside the
// prefix are not Outflow's and are not counted.
func (b *kafkaBackend) groupCommits(name string, n int) ([]groupOffsets, error) {
	groups, err := b.admin.ListConsumerGroups()
	if err != nil {
		return nil, fmt.Errorf("list consumer groups: %w", err)
	}
	names := make([]string, 0, len(groups))
	for g := range groups {
		if strings.HasPrefix(g, b.cfg.Kafka.TopicPrefix) {
			names = append(names, g)
		}
	}
	slices.Sort(names) // the same group named first each time, for the log
	parts := make([]int32, n)
	for i := range parts {
		parts[i] = int32(i)
	}
	var out []groupOffsets
	for _, g := range names {
		resp, err := b.admin.ListConsumerGroupOffsets(g, map[string][]int32{name: parts})
		switch {
		case errors.Is(err, sarama.ErrGroupIDNotFound):
			continue // gone meanwhile, or no offsets yet (kfake)
		case err != nil:
			return nil, fmt.Errorf("offsets of group %s: %w", g, err)
		}
		o := groupOffsets{name: g, commits: make([]commit, n)}
		reads := false
		for i, p := range parts {
			o.commits[i].offset = -1
			if blk := resp.GetBlock(name, p); blk != nil && errors.Is(blk.Err, sarama.ErrNoError) && blk.Offset >= 0 {
				o.commits[i] = commit{offset: blk.Offset, meta: blk.Metadata}
				reads = true
			}
		}
		if reads {
			out = append(out, o)
		}
	}
	return out, nil
}

// trusted is the groups' next offsets Check counts: a commit stamped by
// the subscriber with another topic id is the old topic's (the old session
// committed after the deletion); one past the high watermark is an offset
// in a log since cut; one whose stamp names another message than the
// record now before it was made in a log since truncated and written
// again. Such a group reads that partition from where its subscriber's
// next session resets it, the log start: it counts as having no offset
// there.
func trusted(groups []groupOffsets, l topicLook) []groupLook {
	out := make([]groupLook, len(groups))
	for i, g := range groups {
		out[i] = groupLook{name: g.name, next: make([]int64, len(g.commits))}
		for p, c := range g.commits {
			out[i].next[p] = -1
			if p < len(l.parts) && trustCommit(c, l.id, l.parts[p]) {
				out[i].next[p] = c.offset
			}
		}
	}
	return out
}

func trustCommit(c commit, id string, part partLook) bool {
	if c.offset < 0 || c.offset > part.high {
		return false
	}
	s := parseStamp(c.meta)
	if s.topicID != "" && id != "" && s.topicID != id {
		return false
	}
	if s.messageID != "" && c.offset > part.start {
		if rec, ok := part.records[c.offset-1]; ok && rec != "" && rec != s.messageID {
			return false
		}
	}
	return true
}

// stamp is the metadata the subscriber commits with each offset (see
// incarnationTracer): the topic id of its session, and the message id of
// the record before the offset when it marked a message.
type stamp struct{ topicID, messageID string }

// String is the metadata: "<topic id> <message id>", the topic id alone
// (no message: an offset reset, or a stamp from before message ids), or
// " <message id>" (a broker without topic ids).
func (s stamp) String() string {
	if s.messageID == "" {
		return s.topicID
	}
	return s.topicID + " " + s.messageID
}

func parseStamp(meta string) stamp {
	tid, mid, _ := strings.Cut(meta, " ")
	return stamp{topicID: tid, messageID: mid}
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
