package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/events/claimcheck"
)

// The journey's queries; each goes through an index (TestQueriesUseIndexes).
const (
	qFindMessage = `SELECT aggregate_type, aggregate_id, aggregate_version, id FROM outbox WHERE message_id = $1`
	// A page of an aggregate's events by keyset on (aggregate_version, id):
	// $5 rows after ($3, $4) in that order (qEventsAfter) or before it in
	// the reverse order (qEventsBefore), through
	// outbox_aggregate_version_idx (every row: published is no row state),
	// whose key ends in (aggregate_version, id): a range scan that the
	// Limit stops, however long the aggregate's history. Only then is each
	// row of the page joined to its state (outboxStateJoin).
	qEventsAfter = `
		SELECT ` + eventColumns + ` FROM (
			SELECT * FROM outbox
			WHERE aggregate_type = $1 AND aggregate_id = $2 AND (aggregate_version, id) > ($3, $4)
			ORDER BY aggregate_version, id LIMIT $5
		) o ` + outboxStateJoin + ` ORDER BY o.aggregate_version, o.id`
	qEventsBefore = `
		SELECT ` + eventColumns + ` FROM (
			SELECT * FROM outbox
			WHERE aggregate_type = $1 AND aggregate_id = $2 AND (aggregate_version, id) < ($3, $4)
			ORDER BY aggregate_version DESC, id DESC LIMIT $5
		) o ` + outboxStateJoin + ` ORDER BY o.aggregate_version DESC, o.id DESC`
	// The consumers' versions of the aggregate: an event is handled by a
	// consumer once its version reached the event's. processed_messages
	// only gives the time of what consumers handled before migration
	// 00026's release, when they still wrote a row per message.
	qVersions = `
		SELECT consumer, version FROM consumer_aggregate_versions
		WHERE consumer = ANY($1) AND aggregate_type = $2 AND aggregate_id = $3`
	qProcessed = `
		SELECT message_id::text, consumer, processed_at FROM processed_messages WHERE message_id = ANY($1::uuid[])`
	qDeadOutcomes = `
		SELECT id, message_id::text, consumer, status, reason, error, attempts, resolved_at FROM dead_letters
		WHERE consumer = ANY($1) AND message_id = ANY($2::uuid[])`
	// The open dead letters of the aggregate below a version, for each
	// consumer: what a held event waits behind. Through
	// dead_letters_open_idx, whose key is (consumer, aggregate_type,
	// aggregate_id, aggregate_version) and whose predicate is the open
	// statuses, read backwards from the version, per consumer (not a scan
	// of a consumer's every open dead letter); the Limit bounds an
	// aggregate with a long chain of them.
	qBlockers = `
		SELECT d.consumer, d.aggregate_version, d.id, d.status FROM unnest($1::text[]) AS c(name) CROSS JOIN LATERAL (
			SELECT consumer, aggregate_version, id, status FROM dead_letters
			WHERE consumer = c.name AND aggregate_type = $2 AND aggregate_id = $3 AND aggregate_version < $4
			  AND status IN ('retrying', 'dead', 'held')
			ORDER BY aggregate_version DESC LIMIT 1000) d`
	// The events' webhook deliveries, one per endpoint (the framework's
	// webhook tables), with their attempts: by the deliveries' (message_id,
	// endpoint_id) key, the endpoints' and the attempts' by delivery.
	qDeliveries = `
		SELECT d.id, d.message_id::text, e.id::text, e.url, d.status, a.attempted_at, a.status_code, a.latency_ms, coalesce(a.error, '')
		FROM webhook_endpoint_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
		LEFT JOIN webhook_endpoint_attempts a ON a.delivery_id = d.id
		WHERE d.message_id = ANY($1::uuid[]) ORDER BY d.id, a.id`
)

type journeyEvent struct {
	ID               int64
	MessageID        string
	Topic            string
	EventType        string
	AggregateVersion int64
	Payload          string
	Metadata         string
	// BodyBytes is the size of the body when it travels by reference
	// (events/claimcheck): the row's payload is the placeholder, the body
	// is in outflow_claim_bodies, which the console never reads (its
	// readers are the consumers granted outflow_claim_reader). 0: inline.
	BodyBytes int
	Attempts  int
	LastError string
	CreatedAt time.Time
	// State is the row's state as the forwarder sees it (outbox_state):
	// published, pending, failed, held, repair or parked.
	State string
	// Published tells the partition's cursor passed the row; PublishedBy
	// is when that cursor last moved, an upper bound of the publish time
	// (no row records its own), nil when not published.
	Published   bool
	PublishedBy *time.Time
	ParkedAt    *time.Time
	// DiscardedAt is when an operator discarded the row: what its
	// consumers received (once published) is its discard marker.
	DiscardedAt *time.Time
	Outcomes    []outcome
	Deliveries  []delivery
}

type outcome struct {
	Consumer    string
	ProcessedAt *time.Time
	Status      string // processed, or the dead letter's status; "" when neither
	Reason      string
	Error       string
	Attempts    int
	DeadID      int64
	// Behind is what a held event (or a gap that timed out) waits behind:
	// the open dead letter of the version before it, when there is one;
	// nil otherwise, when the version before it has not reached the
	// consumer.
	Behind *blocker
}

// blocker is the open dead letter a held event waits behind: the version
// right before it (Version), and when that one is held too, the first
// version down the chain that is not (Root), the one to retry or discard.
type blocker struct {
	Consumer string
	Version  int64
	DeadID   int64
	Status   string
	// Root is the dead letter that holds the chain, nil when it is the
	// version right before (Version itself is not held).
	Root *blocker
}

// Href opens the /dead page that holds the blocker's dead letter.
func (b blocker) Href() string { return deadHref(b.Consumer, b.DeadID) }

// Open tells the outcome's dead letter waits (retrying, dead or held): it
// is on the /dead list.
func (o outcome) Open() bool {
	return o.DeadID != 0 && (o.Status == "retrying" || o.Status == "dead" || o.Status == "held")
}

// DeadHref opens the /dead page that holds the outcome's dead letter.
func (o outcome) DeadHref() string { return deadHref(o.Consumer, o.DeadID) }

// deadHref is the /dead page of a consumer's dead letters that starts
// with the dead letter (at=: the list marks it), scrolled to its row: not
// the list's first page, which may not hold it.
func deadHref(consumer string, id int64) string {
	return "/dead?" + url.Values{"consumer": {consumer}, "at": {strconv.FormatInt(id, 10)}}.Encode() +
		"#dead-" + strconv.FormatInt(id, 10)
}

type delivery struct {
	ID         int64
	EndpointID string
	URL        string
	Status     string
	Attempts   []attempt
}

type attempt struct {
	At         time.Time
	StatusCode *int
	LatencyMS  float64
	Error      string
}

// eventColumns are what a journey shows of an outbox row (o) and its state
// (outboxStateJoin's f, p and s), in the order scanEvent reads them. The
// outbox's own discarded_at is that of a row discarded before 00025
// (outbox_failures has it since).
const eventColumns = `o.id, o.message_id::text, o.topic, o.event_type, o.aggregate_version, o.payload::text, o.metadata::text,
			       coalesce(f.attempts, 0), coalesce(f.last_error, ''), o.created_at, s.state, s.state = 'published',
			       CASE WHEN s.state = 'published' THEN p.published_through_at END, f.parked_at,
			       coalesce(f.discarded_at, o.discarded_at)`

// outboxStateJoin joins each outbox row o of a page to its state as the
// view outbox_state computes it: its row of outbox_failures (f, by primary
// key), its partition's cursor (p, by primary key, its partition by
// outbox_partition_of) and the state s. Written out rather than a join to the view:
// the planner may join the view whole (every outbox row) before the page.
const outboxStateJoin = `
		LEFT JOIN outbox_failures f ON f.id = o.id
		LEFT JOIN outbox_partitions p ON p.partition = outbox_partition_of(o.id, o.aggregate_id)
		CROSS JOIN LATERAL (SELECT CASE
			WHEN f.parked_at IS NOT NULL THEN 'parked'
			WHEN f.id IS NOT NULL THEN f.kind
			WHEN o.id <= p.published_through OR (o.id <= p.published_high AND o.transaction_id <> ALL(p.waiting_xids)) THEN 'published'
			ELSE 'pending' END AS state) s`

// journeyLead is how many events a lookup by message id shows before the
// message, when it has that many: what led to it, such as the parked event
// a strict consumer holds it behind.
const journeyLead = 5

// position is a place in an aggregate's events, their keyset: the
// after= and before= of the journey's links, written "<version>.<id>".
type position struct{ Version, ID int64 }

func (p position) String() string {
	return strconv.FormatInt(p.Version, 10) + "." + strconv.FormatInt(p.ID, 10)
}

// errBadPosition is a journey's after= or before= that is not a position.
var errBadPosition = errors.New("bad position")

func parsePosition(field, s string) (position, error) {
	v, id, ok := strings.Cut(s, ".")
	var p position
	var errV, errID error
	p.Version, errV = strconv.ParseInt(v, 10, 64)
	p.ID, errID = strconv.ParseInt(id, 10, 64)
	if !ok || errV != nil || errID != nil || p.Version < 0 || p.ID < 0 {
		return p, fmt.Errorf("%w: %s must be <aggregate version>.<outbox id>, as the journey's links write it; got %q",
			errBadPosition, field, s)
	}
	return p, nil
}

// journeyPosition is where a journey's page starts: after= or before= (one
// at most), else nil.
type journeyPosition struct {
	pos    position
	before bool
	// aggType and aggID name the aggregate, as the pager's links write
	// them: q may be a message id that retention has purged since.
	aggType, aggID string
}

func journeyPositionOf(r *http.Request) (*journeyPosition, error) {
	q := r.URL.Query()
	after, before := q.Get("after"), q.Get("before")
	switch {
	case after != "" && before != "":
		return nil, fmt.Errorf("%w: give after or before, not both", errBadPosition)
	case after == "" && before == "":
		return nil, nil
	}
	at := &journeyPosition{before: before != "", aggType: q.Get("aggregate_type"), aggID: q.Get("aggregate_id")}
	var err error
	if at.before {
		at.pos, err = parsePosition("before", before)
	} else {
		at.pos, err = parsePosition("after", after)
	}
	return at, err
}

type journey struct {
	Query                      string
	AggregateType, AggregateID string
	// Events is one page, in version order.
	Events []journeyEvent
	// Earlier and Later are the positions the links to the neighbouring
	// pages start from; nil on the first, the last page.
	Earlier, Later *position
	// Focus is the outbox id of the message looked up (q), 0 when q is
	// not a message id or the message is on another page.
	Focus        int64
	FocusVersion int64
	// Positioned is a page opened at after= or before=: empty, it is past
	// the aggregate's events, not a query that found none.
	Positioned bool
	// Consumers a replay can go to, each with what it would send; empty
	// when no broker is configured.
	ReplayTo []replayChoice
	// Replays are the aggregate's newest replays, from the audit (audit.go).
	Replays replays
}

// FirstVersion and LastVersion are the page's range of versions.
func (j journey) FirstVersion() int64 { return j.Events[0].AggregateVersion }
func (j journey) LastVersion() int64  { return j.Events[len(j.Events)-1].AggregateVersion }

func (c *Console) journeyPage(w http.ResponseWriter, r *http.Request, s session) {
	p := c.pageFor(s, "Journey")
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	at, err := journeyPositionOf(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	j := journey{Query: q}
	if q != "" {
		if j, err = c.readJourney(r.Context(), q, at); err != nil {
			c.fail(w, r, err)
			return
		}
	}
	if j.AggregateID != "" {
		if j.Replays, err = c.readReplays(r.Context(), j.AggregateType, j.AggregateID); err != nil {
			c.fail(w, r, err)
			return
		}
	}
	if c.cfg.Broker != nil && len(j.Events) > 0 {
		if j.ReplayTo, err = c.replayChoices(r.Context(), j.AggregateType, j.AggregateID); err != nil {
			c.fail(w, r, err)
			return
		}
	}
	p.Data = j
	if p.Result, err = c.doneAction(r); err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, http.StatusOK, "journey", p)
}

// readJourney finds q's aggregate (q is a message id, else an aggregate id
// of Config.AggregateType) and reads one page of its events (Config.PageSize)
// with their outcomes: from at when given; else the page around the
// message q names, journeyLead events before it; else the newest page,
// which holds what is pending or parked (an aggregate's newest events; a
// payment's whole journey). Each query goes through an index: the outbox's
// message_id, outbox_aggregate_version_idx (then each row's state by the
// primary keys of outbox and outbox_failures), the primary keys of
// consumer_aggregate_versions and processed_messages, dead_letters'
// (consumer, message_id), and
// webhook_endpoint_deliveries' (message_id, endpoint_id).
func (c *Console) readJourney(ctx context.Context, q string, at *journeyPosition) (journey, error) {
	j := journey{Query: q, AggregateType: c.cfg.AggregateType, AggregateID: q, Positioned: at != nil}
	pool := c.cfg.Pool
	var msg *position
	if id, err := uuid.Parse(q); err == nil {
		var m position
		err := pool.QueryRow(ctx, qFindMessage, id).Scan(&j.AggregateType, &j.AggregateID, &m.Version, &m.ID)
		switch {
		case err == nil:
			msg = &m
		case !errors.Is(err, pgx.ErrNoRows):
			return j, fmt.Errorf("journey: find message: %w", err)
		}
	}
	if at != nil && at.aggType != "" && at.aggID != "" {
		// A page the pager links to names its aggregate: q's message may
		// have been purged since (it still marks the message if not).
		if msg != nil && (j.AggregateType != at.aggType || j.AggregateID != at.aggID) {
			msg = nil
		}
		j.AggregateType, j.AggregateID = at.aggType, at.aggID
	}
	n := c.cfg.PageSize
	// A page is the events before a position (newest first, reversed
	// below) and those after it; each read asks for one row more than it
	// may show, which tells whether there is a page beyond.
	read := func(q string, from position, limit int) ([]journeyEvent, error) {
		rows, err := pool.Query(ctx, q, j.AggregateType, j.AggregateID, from.Version, from.ID, limit)
		if err != nil {
			return nil, fmt.Errorf("journey: read events: %w", err)
		}
		evs, err := pgx.CollectRows(rows, scanEvent)
		if err != nil {
			return nil, fmt.Errorf("journey: read events: %w", err)
		}
		return evs, nil
	}
	var before, after []journeyEvent
	var err error
	lead := 0
	switch {
	case at != nil && at.before:
		before, err = read(qEventsBefore, at.pos, n+1)
		lead = n
	case at != nil:
		after, err = read(qEventsAfter, at.pos, n+1)
	case msg != nil:
		// (version, id - 1) is just before the message: ids are unique.
		if after, err = read(qEventsAfter, position{msg.Version, msg.ID - 1}, n+1); err == nil {
			before, err = read(qEventsBefore, *msg, n+1)
		}
		lead = min(journeyLead, n-1)
		if len(after) < n-lead { // near the newest: fill the page with earlier events
			lead = n - len(after)
		}
	default:
		before, err = read(qEventsBefore, position{math.MaxInt64, math.MaxInt64}, n+1)
		lead = n
	}
	if err != nil {
		return j, err
	}
	lead = min(lead, len(before))
	rest := min(n-lead, len(after))
	j.Events = make([]journeyEvent, 0, lead+rest)
	for i := lead - 1; i >= 0; i-- {
		j.Events = append(j.Events, before[i])
	}
	j.Events = append(j.Events, after[:rest]...)
	if len(j.Events) == 0 {
		return j, nil
	}
	first, last := &position{j.Events[0].AggregateVersion, j.Events[0].ID},
		&position{j.Events[len(j.Events)-1].AggregateVersion, j.Events[len(j.Events)-1].ID}
	if len(before) > lead {
		j.Earlier = first
	}
	if len(after) > rest {
		j.Later = last
	}
	// A page read in one direction looks one row the other way: the
	// position it was opened at may be no event's (a link written by hand,
	// an edge that retention deleted).
	switch {
	case at != nil && at.before:
		more, err := read(qEventsAfter, *last, 1)
		if err != nil {
			return j, err
		}
		if len(more) > 0 {
			j.Later = last
		}
	case at != nil:
		more, err := read(qEventsBefore, *first, 1)
		if err != nil {
			return j, err
		}
		if len(more) > 0 {
			j.Earlier = first
		}
	}
	if msg != nil {
		for _, e := range j.Events {
			if e.ID == msg.ID {
				j.Focus, j.FocusVersion = e.ID, e.AggregateVersion
			}
		}
	}
	ids := make([]string, len(j.Events))
	byID := map[string]*journeyEvent{}
	for i := range j.Events {
		ids[i] = j.Events[i].MessageID
		byID[ids[i]] = &j.Events[i]
	}
	if err := c.readOutcomes(ctx, j.AggregateType, j.AggregateID, ids, byID); err != nil {
		return j, err
	}
	if err := c.readDeliveries(ctx, ids, byID); err != nil {
		return j, err
	}
	return j, nil
}

func scanEvent(r pgx.CollectableRow) (journeyEvent, error) {
	var e journeyEvent
	err := r.Scan(&e.ID, &e.MessageID, &e.Topic, &e.EventType, &e.AggregateVersion, &e.Payload, &e.Metadata,
		&e.Attempts, &e.LastError, &e.CreatedAt, &e.State, &e.Published, &e.PublishedBy, &e.ParkedAt, &e.DiscardedAt)
	if err == nil {
		var md map[string]string
		if json.Unmarshal([]byte(e.Metadata), &md) == nil {
			if ref, ok, rerr := claimcheck.RefFromMetadata(md); ok && rerr == nil {
				e.BodyBytes = ref.Size
			}
		}
	}
	return e, err
}

// readOutcomes reads what each consumer made of the events: an event is
// processed once the consumer's version of the aggregate reached it
// (applied, or skipped as a duplicate or stale), unless it waits in
// dead_letters; when it is, a time only for the rows written before
// migration 00026's release (processed_messages) and for a parked message
// applied later (its dead letter's resolved_at).
func (c *Console) readOutcomes(ctx context.Context, aggType, aggID string, ids []string, byID map[string]*journeyEvent) error {
	names := make([]string, len(c.cfg.Consumers))
	for i, cs := range c.cfg.Consumers {
		names[i] = cs.Name
	}
	versions := map[string]int64{}
	rows, err := c.cfg.Pool.Query(ctx, qVersions, names, aggType, aggID)
	if err != nil {
		return fmt.Errorf("journey: read consumer versions: %w", err)
	}
	var (
		name    string
		version int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&name, &version}, func() error {
		versions[name] = version
		return nil
	}); err != nil {
		return fmt.Errorf("journey: read consumer versions: %w", err)
	}
	processed := map[[2]string]time.Time{}
	rows, err = c.cfg.Pool.Query(ctx, qProcessed, ids)
	if err != nil {
		return fmt.Errorf("journey: read processed messages: %w", err)
	}
	var (
		mid, consumer string
		at            time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&mid, &consumer, &at}, func() error {
		processed[[2]string{mid, consumer}] = at
		return nil
	}); err != nil {
		return fmt.Errorf("journey: read processed messages: %w", err)
	}
	dead := map[[2]string]outcome{}
	rows, err = c.cfg.Pool.Query(ctx, qDeadOutcomes, names, ids)
	if err != nil {
		return fmt.Errorf("journey: read dead letters: %w", err)
	}
	var (
		o        outcome
		resolved *time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&o.DeadID, &mid, &o.Consumer, &o.Status, &o.Reason, &o.Error, &o.Attempts, &resolved}, func() error {
		d := o
		if resolved != nil {
			at := *resolved // the scan target is reused
			d.ProcessedAt = &at
		}
		dead[[2]string{mid, o.Consumer}] = d
		return nil
	}); err != nil {
		return fmt.Errorf("journey: read dead letters: %w", err)
	}
	behind, err := c.readBlockers(ctx, names, aggType, aggID, ids, byID, dead)
	if err != nil {
		return err
	}
	for _, id := range ids {
		e := byID[id]
		for _, name := range names {
			k := [2]string{id, name}
			// A parked message's outcome is its dead letter's, applied at
			// resolved_at when resolved.
			o, ok := dead[k]
			switch {
			case ok && o.Status == "resolved":
				o.Status = "processed"
			case ok:
			default:
				o = outcome{Consumer: name}
				if v, ok := versions[name]; ok && v >= e.AggregateVersion {
					o.Status = "processed"
				}
				if at, ok := processed[k]; ok {
					o.ProcessedAt, o.Status = &at, "processed"
				}
			}
			if waits(o) {
				o.Behind = behind(name, e.AggregateVersion)
			}
			e.Outcomes = append(e.Outcomes, o)
		}
	}
	return nil
}

// waits tells an outcome that waits for the version before it: held, or
// dead because its gap timed out.
func waits(o outcome) bool {
	return o.Status == "held" || (o.Status == "dead" && o.Reason == "gap")
}

// readBlockers reads what the page's waiting outcomes (waits) are held
// behind: the consumers' open dead letters of the aggregate below the
// newest waiting version (qBlockers). It returns the lookup of a
// consumer's and version's blocker, nil when the version before it has no
// open dead letter. The dead letter's reason, written when the event was
// held ("version 3 arrived before version 2"), is what was true then: the
// version before may have arrived since, and died.
func (c *Console) readBlockers(ctx context.Context, names []string, aggType, aggID string, ids []string,
	byID map[string]*journeyEvent, dead map[[2]string]outcome) (func(string, int64) *blocker, error) {
	var top int64
	for _, id := range ids {
		for _, name := range names {
			if o, ok := dead[[2]string{id, name}]; ok && waits(o) {
				top = max(top, byID[id].AggregateVersion)
			}
		}
	}
	none := func(string, int64) *blocker { return nil }
	if top == 0 {
		return none, nil
	}
	rows, err := c.cfg.Pool.Query(ctx, qBlockers, names, aggType, aggID, top)
	if err != nil {
		return none, fmt.Errorf("journey: read what held events wait behind: %w", err)
	}
	open := map[string]map[int64]blocker{}
	var b blocker
	if _, err := pgx.ForEachRow(rows, []any{&b.Consumer, &b.Version, &b.DeadID, &b.Status}, func() error {
		if open[b.Consumer] == nil {
			open[b.Consumer] = map[int64]blocker{}
		}
		open[b.Consumer][b.Version] = b
		return nil
	}); err != nil {
		return none, fmt.Errorf("journey: read what held events wait behind: %w", err)
	}
	return func(consumer string, version int64) *blocker {
		prev, ok := open[consumer][version-1]
		if !ok {
			return nil
		}
		out := prev
		// Down a chain of held versions to the first that is not held.
		for cur := prev; cur.Status == "held"; {
			next, ok := open[consumer][cur.Version-1]
			if !ok {
				break
			}
			if next.Status != "held" {
				out.Root = &next
				break
			}
			cur = next
		}
		return &out
	}, nil
}

func (c *Console) readDeliveries(ctx context.Context, ids []string, byID map[string]*journeyEvent) error {
	// Any service's, FrameworkOnly or not: the tables say.
	if ok, err := c.webhooksInstalled(ctx); err != nil || !ok {
		return err
	}
	rows, err := c.cfg.Pool.Query(ctx, qDeliveries, ids)
	if err != nil {
		return fmt.Errorf("journey: read webhook deliveries: %w", err)
	}
	var (
		id            int64
		mid, eid, url string
		status        string
		at            *time.Time
		code          *int
		latency       *float64
		errText       string
		lastDelID     int64
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &mid, &eid, &url, &status, &at, &code, &latency, &errText}, func() error {
		e := byID[mid]
		if id != lastDelID {
			e.Deliveries = append(e.Deliveries, delivery{ID: id, EndpointID: eid, URL: url, Status: status})
			lastDelID = id
		}
		if at != nil {
			d := &e.Deliveries[len(e.Deliveries)-1]
			a := attempt{At: *at, Error: errText}
			if code != nil {
				v := *code // the scan target is reused
				a.StatusCode = &v
			}
			if latency != nil {
				a.LatencyMS = *latency
			}
			d.Attempts = append(d.Attempts, a)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("journey: read webhook deliveries: %w", err)
	}
	return nil
}
