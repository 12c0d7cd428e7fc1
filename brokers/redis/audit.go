package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/forwarder"
)

var _ forwarder.Auditor = (*Broker)(nil)

// auditState is what one audit of a stream leaves for the next: the
// forwarder keeps it in PostgreSQL, opaque.
type auditState struct {
	// Canary is the token of the stream's canary key, written when the
	// baseline was taken: a flush or a restart without persistence takes
	// it with the stream.
	Canary string `json:"c"`
	// Added is the stream's entries-added: it never goes back, trimming
	// included, unless entries the stream had were lost.
	Added int64 `json:"n"`
	// Last is the stream's last-generated-id.
	Last string `json:"l"`
	// SafeSince (Unix ms, the Redis clock) is the time of the oldest entry
	// some group had not acknowledged, or of the oldest entry when no
	// group exists: what a loss found next time may have taken starts
	// there, and what is older every group had handled.
	SafeSince int64 `json:"s"`
	// Acked is the newest id Redis had acknowledged to this process's
	// Publish when this state was taken: looked for by that audit, so not
	// again. Kept in the saved state rather than forgotten in memory, so
	// that a pass that rolls back looks for it again.
	Acked string `json:"a,omitempty"`
}

// ackedIDs remembers, per stream, the newest entry id Redis acknowledged
// to this process's Publish since the stream's last audit. The audit looks
// for it: a failover to a replica that lacked only what was written since
// the last audit leaves entries-added, last-generated-id and the canary as
// the audit last saw them (or ahead), and only an id Redis acknowledged
// then shows what is missing.
type ackedIDs struct {
	mu   sync.Mutex
	last map[string]string
}

func (a *ackedIDs) note(stream, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == nil {
		a.last = make(map[string]string)
	}
	if cur, ok := a.last[stream]; !ok || lessID(cur, id) {
		a.last[stream] = id
	}
}

// newest returns the stream's newest acknowledged id. It is kept, not
// taken: an audit whose pass rolls back (its state not saved) must find it
// again next time, since it is the only sign of a failover that lost only
// recent writes. Once a saved state's last id is at or past it, probeIDs
// no longer looks for it.
func (a *ackedIDs) newest(stream string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last[stream]
}

// observed is one look at a stream.
type observed struct {
	acked  string    // the newest id acknowledged to this process, read before the look
	now    time.Time // Redis's TIME, taken first
	canary string    // "" when the key is missing
	stream bool      // the stream exists
	added  int64
	last   string // last-generated-id
	first  string // the first entry's id, "" when the stream is empty
	// floors holds each group's oldest entry not acknowledged: its oldest
	// pending entry, or the one after its last delivered when nothing is
	// pending. Trim keeps everything from the lowest floor.
	floors map[string]string
	// probe is an entry the stream must still hold unless trimmed (see
	// probeIDs): the first found missing, or else the last looked for; ""
	// when none. probeGone: it is not in the stream.
	probe     string
	probeGone bool
}

// decide is the audit's judgement: the reason of a loss, or "" when the
// stream holds everything prev had seen that a group had not acknowledged.
// Normal trimming (Trim, which keeps every group's unacknowledged entries)
// is never a loss.
func decide(prev *auditState, o observed) string {
	switch {
	case prev == nil:
		return "" // a baseline
	case o.canary == "":
		return "canary missing: the data set was flushed or lost (restart without persistence, failover to an empty replica)"
	case o.canary != prev.Canary:
		return "canary replaced: the data set was replaced"
	case !o.stream && prev.Added > 0:
		return fmt.Sprintf("stream missing, it had %d entries added", prev.Added)
	case !o.stream && o.probe != "":
		return fmt.Sprintf("stream missing, entry %s was acknowledged to the forwarder", o.probe)
	case !o.stream:
		return ""
	case o.added < prev.Added:
		return fmt.Sprintf("entries-added went back from %d to %d", prev.Added, o.added)
	case prev.Last != "" && lessID(o.last, prev.Last):
		return fmt.Sprintf("last-generated-id went back from %s to %s", prev.Last, o.last)
	case o.probe != "" && lessID(o.last, o.probe):
		return fmt.Sprintf("entry %s, acknowledged to the forwarder, is above the stream's last-generated-id %s", o.probe, o.last)
	case !o.probeGone:
		return ""
	case o.first != "" && !lessID(o.probe, o.first):
		return fmt.Sprintf("entry %s missing, above the stream's first entry %s", o.probe, o.first)
	case len(o.floors) == 0:
		return fmt.Sprintf("entry %s missing from a stream without consumer groups (nothing trims one)", o.probe)
	}
	for g, floor := range o.floors {
		if !lessID(o.probe, floor) {
			return fmt.Sprintf("entry %s missing while group %s had not acknowledged it", o.probe, g)
		}
	}
	return "" // trimmed: every group had acknowledged it
}

// safeSince is the time from which a loss after o may have taken entries
// some consumer still needs: the oldest entry a group has not acknowledged,
// the oldest entry when no group exists (nothing trims such a stream), and
// o.now when every entry was acknowledged (an entry added later has an id
// above now). Stream ids carry their Redis time in ms.
func safeSince(o observed) int64 {
	now := o.now.UnixMilli()
	if !o.stream || o.first == "" {
		return now
	}
	if len(o.floors) == 0 {
		return idMillis(o.first)
	}
	floor := ""
	for _, f := range o.floors {
		if floor == "" || lessID(f, floor) {
			floor = f
		}
	}
	if lessID(floor, o.first) {
		floor = o.first
	}
	if lessID(o.last, floor) {
		return now
	}
	return min(idMillis(floor), now)
}

func idMillis(id string) int64 {
	ms, _ := parseID(id)
	return int64(ms)
}

// Topics lists the streams of topic: [forwarder.Auditor].
func (b *Broker) Topics(topic string) []string { return b.Streams(topic) }

// BrokerTopic is the stream of topic's aggregateID: [forwarder.Auditor].
func (b *Broker) BrokerTopic(topic, aggregateID string) string { return b.Stream(topic, aggregateID) }

// CanaryKey is the key of stream's audit canary. It hashes to the stream's
// Cluster slot (so it lives, fails over and is lost with the stream): its
// hash tag is the stream's own when the stream name has one, the whole
// stream name otherwise. It starts with the stream name, so whatever
// selects a prefix's keys (a SCAN, a cleanup) selects it too. (A stream
// name holding a brace but no hash tag, as "a{}b" or "a}b", gets a canary
// of another slot: on a Cluster it may live on another shard, and a
// failover of the stream's shard alone is then seen by the other marks
// only.)
func CanaryKey(stream string) string {
	if hasHashTag(stream) {
		return stream + ":outflow-audit"
	}
	return stream + ":outflow-audit{" + stream + "}"
}

// hasHashTag reports whether key has a Redis Cluster hash tag: a "{" with
// a "}" after it and something in between.
func hasHashTag(key string) bool {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return false
	}
	j := strings.IndexByte(key[i+1:], '}')
	return j > 0
}

// Audit compares stream with prev (see [forwarder.Auditor]): the canary
// key, XINFO STREAM (entries-added, last-generated-id; then the first
// entry), XINFO GROUPS, an XPENDING per group, and at most two XRANGEs of a
// single id (see probeIDs): a handful of commands in two round trips, none
// reading more than the entries XINFO STREAM returns and one more.
func (b *Broker) Audit(ctx context.Context, stream string, prev []byte) ([]byte, *forwarder.Loss, error) {
	var st *auditState
	if len(prev) > 0 {
		st = new(auditState)
		if err := json.Unmarshal(prev, st); err != nil {
			st = nil // unreadable: a new baseline, as for a lost state
		}
	}
	o, err := b.observe(ctx, stream, st)
	if err != nil {
		return nil, nil, fmt.Errorf("redis audit %s: %w", stream, err)
	}
	reason := decide(st, o)
	if o.canary == "" {
		if o.canary, err = b.plantCanary(ctx, stream); err != nil {
			return nil, nil, fmt.Errorf("redis audit %s: %w", stream, err)
		}
	}
	acked := o.acked
	if st != nil && (acked == "" || (st.Acked != "" && lessID(acked, st.Acked))) {
		acked = st.Acked
	}
	next, err := json.Marshal(auditState{Canary: o.canary, Added: o.added, Last: o.last, SafeSince: safeSince(o), Acked: acked})
	if err != nil {
		return nil, nil, fmt.Errorf("redis audit %s: %w", stream, err)
	}
	if reason == "" {
		return next, nil, nil
	}
	return next, &forwarder.Loss{Since: time.UnixMilli(st.SafeSince), Reason: reason}, nil
}

func (b *Broker) observe(ctx context.Context, stream string, prev *auditState) (o observed, err error) {
	// Read before the look: an id acknowledged after it may be newer than
	// the stream as seen, and is the next audit's. One a saved state
	// already looked for is not looked for again.
	newest := b.acked.newest(stream)
	defer func() { o.acked = newest }()
	acked := newest
	if prev != nil && acked != "" && prev.Acked != "" && !lessID(prev.Acked, acked) {
		acked = ""
	}
	c := b.cfg.Client
	pipe := c.Pipeline()
	tcmd := pipe.Time(ctx)
	gcmd := pipe.Get(ctx, CanaryKey(stream))
	scmd := pipe.XInfoStream(ctx, stream)
	grcmd := pipe.XInfoGroups(ctx, stream)
	if err := pipelineFailed(pipe.Exec(ctx)); err != nil {
		return observed{}, err
	}

	if o.now, err = tcmd.Result(); err != nil {
		return o, fmt.Errorf("TIME: %w", err)
	}
	switch o.canary, err = gcmd.Result(); {
	case errors.Is(err, goredis.Nil):
		o.canary = ""
	case err != nil:
		return o, fmt.Errorf("GET canary: %w", err)
	}
	info, err := scmd.Result()
	if isNoSuchKey(err) {
		if prev != nil {
			o.probe = acked // any id acknowledged since is gone
		}
		return o, nil
	}
	if err == nil && info == nil {
		err = errors.New("no reply") // the pipeline did not run it
	}
	if err != nil {
		return o, fmt.Errorf("XINFO STREAM: %w", err)
	}
	o.stream, o.added, o.last = true, info.EntriesAdded, info.LastGeneratedID
	groups, err := grcmd.Result()
	if err != nil && !isNoSuchKey(err) {
		return o, fmt.Errorf("XINFO GROUPS: %w", err)
	}

	var probes []string
	if prev != nil {
		probes = probeIDs(prev, acked, o.last)
	}
	for _, id := range probes {
		if lessID(o.last, id) {
			o.probe = id // above the stream's last id: gone, no look needed
			probes = nil
			break
		}
	}
	if b.auditHook != nil {
		b.auditHook()
	}

	// The second look: the probes first, then what tells a trim from a
	// loss (the first entry, each group's oldest unacknowledged entry).
	// Read after the probes, these are at least as new as any trim that
	// took a probe away (a trim keeps every group's unacknowledged
	// entries, and acknowledgements only move forward), so a trim racing
	// the audit is seen as the trim it is; read before, a probe trimmed in
	// between looked lost.
	pipe = c.Pipeline()
	rcmds := make([]*goredis.XMessageSliceCmd, 0, len(probes))
	for _, id := range probes {
		rcmds = append(rcmds, pipe.XRange(ctx, stream, id, id))
	}
	scmd = pipe.XInfoStream(ctx, stream)
	grcmd = pipe.XInfoGroups(ctx, stream)
	// Every group the first look found, whatever its pending count was
	// then: entries may have been delivered since.
	pending := make(map[string]*goredis.XPendingCmd, len(groups))
	for _, g := range groups {
		pending[g.Name] = pipe.XPending(ctx, stream, g.Name)
	}
	if err := pipelineFailed(pipe.Exec(ctx)); err != nil {
		return o, err
	}
	for i, cmd := range rcmds {
		msgs, err := cmd.Result()
		if err != nil {
			return o, fmt.Errorf("XRANGE: %w", err)
		}
		if o.probe == "" || !o.probeGone {
			o.probe, o.probeGone = probes[i], len(msgs) == 0
		}
	}
	info, err = scmd.Result()
	if isNoSuchKey(err) {
		o.stream = false // deleted since the first look
		return o, nil
	}
	if err == nil && info == nil {
		err = errors.New("no reply")
	}
	if err != nil {
		return o, fmt.Errorf("XINFO STREAM: %w", err)
	}
	if info.Length > 0 {
		o.first = info.FirstEntry.ID
	}
	if groups, err = grcmd.Result(); err != nil && !isNoSuchKey(err) {
		return o, fmt.Errorf("XINFO GROUPS: %w", err)
	}
	o.floors = make(map[string]string, len(groups))
	for _, g := range groups {
		o.floors[g.Name] = nextID(g.LastDeliveredID)
		cmd, known := pending[g.Name]
		switch {
		case !known && g.Pending > 0:
			// Created between the looks, with entries already pending:
			// their oldest is unknown, so nothing counts as trimmed.
			o.floors[g.Name] = "0-1"
		case !known:
		default:
			p, err := cmd.Result()
			if err != nil && strings.Contains(err.Error(), "NOGROUP") {
				continue // destroyed between the commands
			}
			if err != nil {
				return o, fmt.Errorf("XPENDING %s: %w", g.Name, err)
			}
			if p.Count > 0 && lessID(p.Lower, o.floors[g.Name]) {
				o.floors[g.Name] = p.Lower
			}
		}
	}
	return o, nil
}

// probeIDs are the entries an audit looks for: prev.Last when
// last-generated-id moved since (a failover that lost entries the previous
// audit saw), and acked when newer (one that lost only entries written
// since). At most two XRANGEs of one id each.
func probeIDs(prev *auditState, acked, last string) []string {
	var ids []string
	if prev.Last != "" && prev.Last != "0-0" && prev.Last != last {
		ids = append(ids, prev.Last)
	}
	if acked != "" && (prev.Last == "" || lessID(prev.Last, acked)) {
		ids = append(ids, acked)
	}
	return ids
}

// plantCanary writes the stream's canary if it is missing (SET NX: two
// auditors at once agree on one) and returns its token.
func (b *Broker) plantCanary(ctx context.Context, stream string) (string, error) {
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	token := hex.EncodeToString(raw[:])
	key := CanaryKey(stream)
	ok, err := b.cfg.Client.SetNX(ctx, key, token, 0).Result()
	if err != nil {
		return "", fmt.Errorf("SET canary: %w", err)
	}
	if ok {
		return token, nil
	}
	got, err := b.cfg.Client.Get(ctx, key).Result()
	if err != nil {
		return "", fmt.Errorf("GET canary: %w", err)
	}
	return got, nil
}

// pipelineFailed returns the error of a pipeline that did not run whole (a
// connection lost, a timeout); a Redis error reply is one command's, and is
// looked at with that command.
func pipelineFailed(_ []goredis.Cmder, err error) error {
	var rerr goredis.Error
	if err == nil || errors.As(err, &rerr) {
		return nil
	}
	return err
}

func isNoSuchKey(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such key")
}
