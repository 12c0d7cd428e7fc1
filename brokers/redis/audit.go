package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	goredis "github.com/redis/go-redis/v9"

	"github.com/outflow-dev/outflow/forwarder"
)

var _ forwarder.Auditor = (*Broker)(nil)

// auditState is what one Check of a stream leaves for the next: the
// forwarder keeps it in PostgreSQL, opaque.
type auditState struct {
	// Canary is the token of the stream's canary key as the last Check
	// saw or wrote it. A flush, a restart without persistence or a
	// failover to an empty replica takes the key with the stream; a data
	// set restored from elsewhere has another token.
	Canary string `json:"c"`
	// Trimmed is the highest MINID Check trimmed the stream to, in that
	// data set: an entry missing below it was trimmed by the audit, which
	// trims only below every group's floor. One missing below the first
	// entry and not below Trimmed cannot be told from an entry a failover
	// lost before new entries were written, so it is taken for lost.
	Trimmed string `json:"t,omitempty"`
	// Trim is the MINID this Check decided to trim the stream to, applied
	// by the next Check: that one is handed this state only once the
	// audit that decided it committed, so a trim never runs ahead of the
	// verdict that accounts for what it removes (an audit rolled back
	// after it trimmed would make the next one take the trimmed entries
	// for lost).
	Trim string `json:"x,omitempty"`
	// Groups are the consumer groups the last Check saw on the stream.
	Groups []string `json:"g,omitempty"`
	// Awaited are groups lost with the data, by when they were first
	// missed (Unix ms): see [forwarder.AwaitLostGroups].
	Awaited map[string]int64 `json:"w,omitempty"`
}

// trimmedTo is the highest MINID the audit trimmed the stream to, or
// decided to (a pending Trim may have run in a Check whose audit rolled
// back): below it, an entry missing is the audit's trim.
func (st *auditState) trimmedTo() string {
	if st == nil {
		return ""
	}
	return maxID(st.Trimmed, st.Trim)
}

func maxID(a, b string) string {
	if a == "" || (b != "" && lessID(a, b)) {
		return b
	}
	return a
}

// probeChunk bounds the XRANGEs of one pipeline.
const probeChunk = 1000

// look is what Check read of a stream.
type look struct {
	// found[i]: held[i]'s entry is in the stream, holding held[i]'s
	// message (or a message without an id field to compare).
	found []bool
	// other[i]: an entry with held[i]'s id holds another message.
	other []bool
	// floors0 are the groups' floors read before the entries were looked
	// for, floors after: each group's oldest entry not acknowledged (its
	// oldest pending entry, or the one after its last delivered).
	floors0, floors map[string]string
	canary          string // "" when the key is missing
	stream          bool   // the stream exists (read after the entries)
	first, last     string // first entry ("" when empty), last-generated-id
	maxDeleted      string // max-deleted-entry-id: XDEL moves it, trimming does not
}

// Check judges each held entry of stream ([forwarder.Auditor]), then trims
// the stream below what every group acknowledged and it settled.
//
// An entry found is Settled when every consumer group had acknowledged it
// before the look (the groups' floors are read first: what was acknowledged
// then was acknowledged while the entry was there), Unsettled otherwise (no
// group yet counts as not acknowledged).
//
// An entry not found is Lost unless the stream shows how it went while
// every group had acknowledged it:
//   - at or below the stream's max-deleted-entry-id: deleted (XDEL,
//     XACKDEL), which trimming never moves;
//   - below what an earlier Check trimmed the stream to (the audit trims
//     only below every group's floor);
//
// in both cases only with every group's floor above it now, and only in a
// data set an earlier Check saw (the canary the previous Check saw, or,
// without a saved state, one an earlier audit planted): after a flush or a
// restart without persistence, new groups reading new entries pass the
// old ids without having read them. Any other missing entry is Lost: above
// the last-generated-id, or below it with nothing to account for it, is
// how a failover to a replica that lacked the last writes, or a restore of
// an older copy, shows once new entries were written; and below the first
// entry, as a trim leaves it, but not below the audit's own trim, is
// another hand's trim or such a failover, which look alike.
//
// The trim removes only entries below every group's floor and below the
// first held entry not settled, so a stream never loses by Outflow's hand
// an entry whose receipt the audit has not settled: a missing entry below
// the first one is then another hand's trim. Check decides it and the next
// Check applies it (see auditState.Trim); with partial, it decides none.
//
// Cost: one XRANGE of one id per held entry (pipelined, probeChunk a
// round trip: the entries are read whole, so an audit reads about what one
// more consumer group would); before them XINFO GROUPS and an XPENDING per
// group with pending entries, after them GET of the canary and XINFO
// STREAM, then XINFO GROUPS and the XPENDINGs again: five round trips
// besides the XRANGEs at most; one XTRIM MINID when a trim is due, exact
// (what it removes, it removes once; an approximate trim would keep up to
// a radix node of settled entries a while longer).
func (b *Broker) Check(ctx context.Context, stream string, prev []byte, held []forwarder.Held, partial bool) (forwarder.Verdict, error) {
	var st *auditState
	if len(prev) > 0 {
		st = new(auditState)
		if json.Unmarshal(prev, st) != nil || st.Canary == "" {
			st = nil // unreadable: as for a lost state
		}
	}
	l, err := b.look(ctx, stream, held)
	if err != nil {
		return forwarder.Verdict{}, fmt.Errorf("redis audit %s: %w", stream, err)
	}
	// Groups lost with the data are awaited: those missing when the data
	// set went (no canary, another one, the stream gone), or, judged
	// again, when the entries show a loss. Not on a mere missing entry: a
	// deletion or a trim of acknowledged entries while a group was
	// destroyed on purpose is no reason to hold the stream for a day.
	var awaited map[string]int64
	if st != nil {
		present := func(g string) bool { _, ok := l.floors[g]; return ok }
		dataLost := l.canary != st.Canary || !l.stream
		now := time.Now()
		awaited = forwarder.AwaitLostGroups(st.Groups, st.Awaited, present, dataLost, now)
		if !dataLost {
			if status, _ := judge(st, l.awaiting(awaited), held); slices.Contains(status, forwarder.Lost) {
				awaited = forwarder.AwaitLostGroups(st.Groups, st.Awaited, present, true, now)
			}
		}
	}
	lw := l.awaiting(awaited)
	status, reason := judge(st, lw, held)

	next := auditState{Canary: l.canary, Awaited: awaited}
	for g := range l.floors {
		next.Groups = append(next.Groups, g)
	}
	slices.Sort(next.Groups)
	if next.Canary == "" {
		if next.Canary, err = b.plantCanary(ctx, stream); err != nil {
			return forwarder.Verdict{}, fmt.Errorf("redis audit %s: %w", stream, err)
		}
	}
	if st != nil && st.Canary == l.canary {
		next.Trimmed = st.Trimmed
		if st.Trim != "" {
			// The trim the previous Check decided: its verdict is
			// committed (this Check was handed its state). One that fails
			// is tried again by the next Check: the bound stays pending.
			if err := b.cfg.Client.XTrimMinID(ctx, stream, st.Trim).Err(); err != nil && !isNoSuchKey(err) {
				next.Trim = st.Trim
			}
			next.Trimmed = maxID(next.Trimmed, st.Trim)
		}
	}
	if !partial {
		if bound := trimBound(lw, held, status); bound != "" && (next.Trimmed == "" || lessID(next.Trimmed, bound)) {
			next.Trim = maxID(next.Trim, bound)
		}
	}
	state, err := json.Marshal(next)
	if err != nil {
		return forwarder.Verdict{}, fmt.Errorf("redis audit %s: %w", stream, err)
	}
	return forwarder.Verdict{State: state, Status: status, Reason: reason, Again: next.Trim != ""}, nil
}

// awaiting is l with the awaited groups' floors at 0-0: they acknowledged
// nothing, so no entry is settled or trimmed under them.
func (l look) awaiting(awaited map[string]int64) look {
	if len(awaited) == 0 {
		return l
	}
	l.floors0, l.floors = maps.Clone(l.floors0), maps.Clone(l.floors)
	for g := range awaited {
		l.floors0[g], l.floors[g] = "0-0", "0-0"
	}
	return l
}

// judge is Check's decision for each held entry, and the reason of the
// first loss.
func judge(st *auditState, l look, held []forwarder.Held) ([]forwarder.Status, string) {
	status := make([]forwarder.Status, len(held))
	reason := ""
	lose := func(i int, why string) {
		status[i] = forwarder.Lost
		if reason == "" {
			reason = why
		}
	}
	// The data set is one an earlier Check saw: its canary is the one the
	// previous Check saw, or, without a saved state, one an earlier audit
	// planted. A data set without the canary was flushed or lost since
	// (or no audit ever ran on it): nothing vouches that the groups there
	// read what is missing.
	trusted := l.canary != "" && (st == nil || st.Canary == l.canary)
	for i, h := range held {
		p := h.Position
		switch {
		case l.other[i]:
			lose(i, fmt.Sprintf("entry %s holds another message: the stream was replaced", p))
		case l.found[i]:
			if acknowledged(l.floors0, p) {
				status[i] = forwarder.Settled
			}
		case !trusted && l.canary == "":
			lose(i, fmt.Sprintf("entry %s missing and the canary too: the data set was flushed or lost (restart without persistence, failover to an empty replica)", p))
		case !trusted:
			lose(i, fmt.Sprintf("entry %s missing and the canary replaced: the data set was replaced", p))
		case !l.stream:
			lose(i, fmt.Sprintf("stream missing, entry %s was acknowledged to the forwarder", p))
		case lessID(l.last, p):
			lose(i, fmt.Sprintf("entry %s missing above the stream's last-generated-id %s: the stream went back (failover, restore)", p, l.last))
		case l.maxDeleted != "" && !lessID(l.maxDeleted, p):
			if g := notAcknowledged(l.floors, p); g != "" {
				lose(i, fmt.Sprintf("entry %s deleted before group %s acknowledged it", p, g))
			} else {
				status[i] = forwarder.Settled // deleted (XDEL, XACKDEL) after every group had it
			}
		case l.first == "" || lessID(p, l.first):
			switch g := notAcknowledged(l.floors, p); {
			case g != "":
				lose(i, fmt.Sprintf("entry %s missing below the stream's first entry while group %s had not acknowledged it", p, g))
			case st.trimmedTo() == "" || !lessID(p, st.trimmedTo()):
				// Below the first entry, as a trim leaves it, but above
				// anything the audit trimmed: someone else's trim, or a
				// failover that lost it before every older entry was
				// trimmed and new ones written. The two look alike.
				lose(i, fmt.Sprintf("entry %s missing below the stream's first entry %q, above what the audit trimmed: a failover lost it, or another hand trimmed it before the audit settled it", p, l.first))
			default:
				status[i] = forwarder.Settled // the audit trimmed it, every group having it
			}
		default:
			lose(i, fmt.Sprintf("entry %s missing above the stream's first entry %s, and no deletion reaches it: a failover or a restart lost it", p, l.first))
		}
	}
	return status, reason
}

// acknowledged reports whether every group's floor is above id, with at
// least one group: an entry nobody reads yet is needed by whoever comes.
func acknowledged(floors map[string]string, id string) bool {
	return len(floors) > 0 && notAcknowledged(floors, id) == ""
}

// notAcknowledged names a group whose floor is at or below id ("" when
// every group's is above; "(no group)" when there is none).
func notAcknowledged(floors map[string]string, id string) string {
	if len(floors) == 0 {
		return "(no group)"
	}
	names := make([]string, 0, len(floors))
	for g := range floors {
		names = append(names, g)
	}
	slices.Sort(names) // the same name each time, for the log
	for _, g := range names {
		if !lessID(id, floors[g]) {
			return g
		}
	}
	return ""
}

// trimBound is the MINID below which Check may trim: the entry after the
// highest of the held entries settled from the lowest on, capped by every
// group's floor; "" when nothing may be trimmed. Entries above the first
// held one not settled stay, so that no receipt the audit keeps points to
// an entry Outflow removed.
func trimBound(l look, held []forwarder.Held, status []forwarder.Status) string {
	if !l.stream || len(l.floors0) == 0 {
		return ""
	}
	order := make([]int, len(held))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return compareID(held[a].Position, held[b].Position) })
	bound := ""
	for _, i := range order {
		if status[i] != forwarder.Settled {
			break
		}
		bound = nextID(held[i].Position)
	}
	if bound == "" {
		return ""
	}
	for _, f := range l.floors0 {
		if lessID(f, bound) {
			bound = f
		}
	}
	if bound == "0-0" {
		return "" // a group awaited: nothing to trim
	}
	return bound
}

// look reads the stream: the groups' floors, then the held entries, then
// the stream's info and canary, then the groups' floors again. Read in
// this order, a deletion, a trim or an acknowledgement racing the look is
// seen for what it is: the floors read first are acknowledgements made
// while the entries found were there, and the stream's first entry,
// max-deleted-entry-id and floors read after the entries are at least as
// new as whatever took one of them away (acknowledgements only move
// forward).
func (b *Broker) look(ctx context.Context, stream string, held []forwarder.Held) (look, error) {
	c := b.cfg.Client
	l := look{found: make([]bool, len(held)), other: make([]bool, len(held))}
	var err error
	if l.floors0, err = b.floors(ctx, stream); err != nil {
		return l, err
	}
	if b.auditHook != nil {
		b.auditHook()
	}
	for start := 0; start < len(held); start += probeChunk {
		chunk := held[start:min(start+probeChunk, len(held))]
		pipe := c.Pipeline()
		cmds := make([]*goredis.XMessageSliceCmd, len(chunk))
		for k, h := range chunk {
			cmds[k] = pipe.XRange(ctx, stream, h.Position, h.Position)
		}
		if err := pipelineFailed(pipe.Exec(ctx)); err != nil {
			return l, err
		}
		for k, cmd := range cmds {
			msgs, err := cmd.Result()
			if err != nil && !isNoSuchKey(err) {
				return l, fmt.Errorf("XRANGE %s: %w", chunk[k].Position, err)
			}
			if len(msgs) == 0 {
				continue
			}
			id, _ := msgs[0].Values[redisstream.UUIDHeaderKey].(string)
			if id != "" && chunk[k].MessageID != "" && id != chunk[k].MessageID {
				l.other[start+k] = true
			} else {
				l.found[start+k] = true
			}
		}
	}
	pipe := c.Pipeline()
	gcmd := pipe.Get(ctx, CanaryKey(stream))
	scmd := pipe.XInfoStream(ctx, stream)
	if err := pipelineFailed(pipe.Exec(ctx)); err != nil {
		return l, err
	}
	switch l.canary, err = gcmd.Result(); {
	case errors.Is(err, goredis.Nil):
		l.canary = ""
	case err != nil:
		return l, fmt.Errorf("GET canary: %w", err)
	}
	info, err := scmd.Result()
	if isNoSuchKey(err) {
		l.floors = map[string]string{}
		return l, nil
	}
	if err == nil && info == nil {
		err = errors.New("no reply") // the pipeline did not run it
	}
	if err != nil {
		return l, fmt.Errorf("XINFO STREAM: %w", err)
	}
	l.stream, l.last, l.maxDeleted = true, info.LastGeneratedID, info.MaxDeletedEntryID
	if info.Length > 0 {
		l.first = info.FirstEntry.ID
	}
	if l.floors, err = b.floors(ctx, stream); err != nil {
		return l, err
	}
	return l, nil
}

// floors reads each consumer group's oldest entry not acknowledged: its
// oldest pending entry, or the one after its last delivered when nothing
// is pending. Trim keeps everything from the lowest.
func (b *Broker) floors(ctx context.Context, stream string) (map[string]string, error) {
	c := b.cfg.Client
	groups, err := c.XInfoGroups(ctx, stream).Result()
	if isNoSuchKey(err) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("XINFO GROUPS: %w", err)
	}
	floors := make(map[string]string, len(groups))
	pipe := c.Pipeline()
	pending := make(map[string]*goredis.XPendingCmd, len(groups))
	for _, g := range groups {
		floors[g.Name] = nextID(g.LastDeliveredID)
		if g.Pending > 0 {
			pending[g.Name] = pipe.XPending(ctx, stream, g.Name)
		}
	}
	if len(pending) == 0 {
		return floors, nil
	}
	if err := pipelineFailed(pipe.Exec(ctx)); err != nil {
		return nil, err
	}
	for name, cmd := range pending {
		p, err := cmd.Result()
		if err != nil && strings.Contains(err.Error(), "NOGROUP") {
			delete(floors, name) // destroyed meanwhile
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("XPENDING %s: %w", name, err)
		}
		if p.Count > 0 && lessID(p.Lower, floors[name]) {
			floors[name] = p.Lower
		}
	}
	return floors, nil
}

// CanaryKey is the key of stream's audit canary. It hashes to the stream's
// Cluster slot (so it lives, fails over and is lost with the stream): its
// hash tag is the stream's own when the stream name has one, the whole
// stream name otherwise. It starts with the stream name, so whatever
// selects a prefix's keys (a SCAN, a cleanup) selects it too. (A stream
// name holding a brace but no hash tag, as "a{}b" or "a}b", gets a canary
// of another slot: on a Cluster it may live on another shard, and a
// flush of the stream's shard alone is then judged by the stream's own
// marks only.)
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
