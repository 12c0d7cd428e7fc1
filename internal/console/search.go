package console

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/app/paymentevents"
)

// The search lists outbox rows, newest first, by message id, aggregate,
// merchant (the reference app's), event type, topic and time window. The
// outbox has an index on its primary key, on message_id and on the
// aggregate, and none on event_type, topic or created_at: each added index
// would cost every producer's INSERT. So a search walks an index (the
// aggregate's, a merchant's payments', or the primary key within the ids of
// the time window) newest first, tests the other criteria on each row it
// reads, and stops after a page of matches or searchBudget rows, whichever
// comes first; a page that stopped on the budget says how far back it
// looked, and its Next goes on from there.

const (
	// searchBudget is how many rows a search page reads at most: a few ms
	// of the primary key and the heap, however rare the matches.
	searchBudget = 10000
	// searchChoicesRows is how many of the newest outbox rows the event
	// types, topics and aggregate types offered are read from.
	searchChoicesRows = 10000
	// searchChoicesSamples and searchChoicesSample are how many samples
	// of the whole history the choices are read from besides, and their
	// rows.
	searchChoicesSamples, searchChoicesSample = 200, 25
	// searchChoicesTTL is how long those choices are reused.
	searchChoicesTTL = 30 * time.Second
	// merchantPaymentsMax is how many payments a merchant may have for
	// the search to read their events by the aggregate index; a merchant
	// with more has its events found by the scan, each row's payment
	// looked up by its primary key.
	merchantPaymentsMax = 500
	// searchCountMax bounds the count shown when it is cheap to make.
	searchCountMax = 10000
	// merchantsMax is how many merchants the merchant filter lists; with
	// more, it takes a merchant id.
	merchantsMax = 200
	// windowSlack widens the ids of a time window: a row's created_at is
	// its transaction's start, its id is drawn when it is inserted, so
	// created_at runs behind id order by up to a transaction's length. A
	// row whose transaction stayed open longer than this before inserting
	// it may be missed at a window's edges.
	windowSlack = time.Minute
)

// searchPresets are the time windows offered as one click, up to now.
var searchPresets = []struct{ Key, Label string }{
	{"15m", "last 15 min"}, {"1h", "last 1 h"}, {"24h", "last 24 h"},
}

// The search's fixed queries; each goes through an index (TestQueriesUseIndexes).
const (
	// The ids' bounds, through the primary key (min/max read one end of
	// each partition's).
	qIDBounds = `SELECT min(id), max(id) FROM outbox`
	// One probe of a time window's binary search on the primary key: the
	// first row at or after an id.
	qIDProbe = `SELECT id, created_at FROM outbox WHERE id >= $1 AND id < $2 ORDER BY id LIMIT 1`
	// What the filters offer: the event types, topics and aggregate types
	// of the newest rows, at most $2 of them, above $1 (the newest id less
	// $2, read first: a constant the planner sees is near the end of the
	// primary key), and of $5 samples of $6 rows spread over the whole
	// history, from $3 every $4 ids: a type of the events of last week is
	// offered too. Each a range of the primary key.
	qSearchChoices = `
		SELECT coalesce(array_agg(DISTINCT event_type), '{}'), coalesce(array_agg(DISTINCT topic), '{}'),
		       coalesce(array_agg(DISTINCT aggregate_type), '{}')
		FROM ((SELECT event_type, topic, aggregate_type FROM outbox WHERE id > $1 ORDER BY id DESC LIMIT $2)
		      UNION ALL
		      (SELECT s.event_type, s.topic, s.aggregate_type FROM generate_series(0, $5 - 1) AS g(i) CROSS JOIN LATERAL (
		           SELECT event_type, topic, aggregate_type FROM outbox WHERE id >= $3 + g.i * $4 ORDER BY id LIMIT $6) s)) n`
	// Whether an aggregate type has an event: the aggregate index's first
	// column.
	qAggregateTypeExists = `SELECT count(*) FROM (SELECT 1 FROM outbox WHERE aggregate_type = $1 LIMIT 1) t`
	// The merchants, by primary key from $1 (a keyset; the list is bounded).
	qMerchants = `SELECT id::text, name FROM merchants WHERE id > $1 ORDER BY id LIMIT $2`
	qMerchant  = `SELECT name FROM merchants WHERE id = $1`
	// A merchant's payments, through payments_merchant_idx.
	qMerchantPayments = `SELECT id::text FROM payments WHERE merchant_id = $1 LIMIT $2`
)

// searchMode is which index a search walks.
type searchMode int

const (
	byRange     searchMode = iota // the primary key, within the time window's ids
	byMessage                     // message_id
	byAggregate                   // outbox_aggregate_version_idx, one aggregate
	byPayments                    // outbox_aggregate_version_idx, a merchant's payments
)

// searchSpec is what shapes a search's SQL: the index walked, the order,
// and which criteria each row is tested against. Never a value: those are
// the named arguments.
type searchSpec struct {
	mode                             searchMode
	asc                              bool // after=: the newer rows, oldest first
	eventType, topic, from, to, merc bool
}

// order is the walk's order, newest first unless asc.
func (s searchSpec) order(prefix string) string {
	dir := " DESC"
	if s.asc {
		dir = ""
	}
	if s.mode == byAggregate {
		return prefix + "aggregate_version" + dir + ", " + prefix + "id" + dir
	}
	return prefix + "id" + dir
}

// where is the walk's index condition, without the page's position when
// !positioned (the count's).
func (s searchSpec) where(positioned bool) string {
	var conds []string
	switch s.mode {
	case byMessage:
		conds = append(conds, "message_id = @message_id")
	case byAggregate:
		conds = append(conds, "aggregate_type = @aggregate_type", "aggregate_id = @aggregate_id")
	case byPayments:
		conds = append(conds, "aggregate_type = @payment_type", "aggregate_id = pay.pid")
	}
	conds = append(conds, "id >= @lo", "id < @hi")
	if positioned {
		op := "<"
		if s.asc {
			op = ">"
		}
		if s.mode == byAggregate {
			conds = append(conds, "(aggregate_version, id) "+op+" (@pos_version, @pos_id)")
		} else {
			conds = append(conds, "id "+op+" @pos_id")
		}
	}
	return strings.Join(conds, " AND ")
}

// filter is the test of each row read against the criteria the index
// does not give.
func (s searchSpec) filter() string {
	var conds []string
	if s.eventType {
		conds = append(conds, "event_type = @event_type")
	}
	if s.topic {
		conds = append(conds, "topic = @topic")
	}
	if s.from {
		conds = append(conds, "created_at >= @from")
	}
	if s.to {
		conds = append(conds, "created_at < @to")
	}
	if s.merc && s.mode != byPayments {
		// The row's payment's merchant, by the payment's primary key (a
		// scalar subquery on the id alone: no plan reads the merchant's
		// payments, which may be millions, for each row). A cast only of
		// an id that is a UUID (CASE evaluates it only then): another
		// aggregate type's id matches nothing.
		conds = append(conds, `(aggregate_type = @payment_type AND (SELECT p.merchant_id FROM payments p
			WHERE p.id = CASE WHEN aggregate_id ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN aggregate_id::uuid END) = @merchant)`)
	}
	if len(conds) == 0 {
		return "true"
	}
	return strings.Join(conds, " AND ")
}

// searchColumns are what the walk reads of each row.
const searchColumns = `id, message_id, topic, event_type, aggregate_type, aggregate_id, aggregate_version, created_at, transaction_id`

// rows is the walk's rows (cols of them) that filter keeps: a merchant's
// payments' events each by the aggregate index (a lateral scan per
// payment, which no plan turns into a walk of the primary key; at most
// merchantPaymentsMax of them, each an aggregate's few events, sorted
// then), else the outbox's by the index where names.
func (s searchSpec) rows(positioned bool, cols, filter string) string {
	if s.mode == byPayments {
		// The Limit (OFFSET 0 for the count, which needs no order) keeps
		// the lateral scan one of its payment's events: a plain subquery
		// would be flattened into a join.
		tail := "OFFSET 0"
		if positioned {
			tail = "ORDER BY aggregate_version DESC, id DESC LIMIT @budget"
		}
		return `SELECT ` + cols + ` FROM unnest(@payments::text[]) AS pay(pid) CROSS JOIN LATERAL (
					SELECT ` + searchColumns + ` FROM outbox WHERE ` + s.where(positioned) + `
					` + tail + `) x WHERE ` + filter
	}
	return `SELECT ` + cols + ` FROM outbox WHERE ` + s.where(positioned) + ` AND ` + filter
}

// pageSQL is a page's query: the walk, at most @budget rows, numbered (k)
// and tested (hit); the rows that hit, and the budget's last row, which
// says where a page that ran out of budget stopped; at most @limit of
// them, in the walk's order, then joined to their state (outboxStateJoin).
// The Limit stops the walk as soon as a page is found: a window function
// over the walk's own order sorts nothing.
func (s searchSpec) pageSQL() string {
	return `
		SELECT o.id, o.message_id::text, o.topic, o.event_type, o.aggregate_type, o.aggregate_id, o.aggregate_version,
		       o.created_at, s.state, f.parked_at, o.hit, o.k
		FROM (
			SELECT * FROM (
				SELECT w.*, row_number() OVER (ORDER BY ` + s.order("w.") + `) AS k, (` + s.filter() + `) AS hit
				FROM (` + s.rows(true, searchColumns, "true") + `
				      ORDER BY ` + s.order("") + ` LIMIT @budget) w
			) n WHERE n.hit OR n.k = @budget ORDER BY ` + s.order("n.") + ` LIMIT @limit
		) o ` + outboxStateJoin + `
		ORDER BY ` + s.order("o.")
}

// countSQL counts the matches up to @count_max: only for the walks that
// are bounded whatever the window (a message, an aggregate, a merchant's
// few payments).
func (s searchSpec) countSQL() string {
	return `SELECT count(*) FROM (` + s.rows(false, "1", s.filter()) + ` LIMIT @count_max) c`
}

// searchForm is a search's criteria, as given and as read.
type searchForm struct {
	ID            string // a message id, else an aggregate id
	AggregateType string
	Merchant      string
	EventType     string
	Topic         string
	// From and To are the window in UTC, as the form writes them back
	// (a preset resolved to its start).
	From, To string
	// Since is the preset asked for ("1h"), resolved to From.
	Since string

	from, to      time.Time
	before, after *position
}

// searchError is a criterion the search cannot use: a 400 that names it.
type searchError struct{ field, msg string }

func (e searchError) Error() string { return e.field + ": " + e.msg }

// timeLayouts are the forms a window's bound may take: UTC unless it says
// otherwise (RFC 3339).
var timeLayouts = []string{"2006-01-02 15:04:05", "2006-01-02T15:04:05", "2006-01-02 15:04", "2006-01-02T15:04", "2006-01-02"}

// formLayout is how the form writes a bound back.
const formLayout = "2006-01-02 15:04:05"

func parseUTC(field, s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.UTC(), nil
	}
	for _, l := range timeLayouts {
		if t, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, searchError{field, fmt.Sprintf("%q is not a time: write it as 2006-01-02 15:04:05 (UTC) or RFC 3339", s)}
}

// parseSearch reads a search's criteria from the query; now resolves a
// preset.
func parseSearch(q url.Values, now time.Time) (searchForm, error) {
	f := searchForm{
		ID: strings.TrimSpace(q.Get("id")), AggregateType: q.Get("aggregate_type"), Merchant: strings.TrimSpace(q.Get("merchant")),
		EventType: q.Get("event_type"), Topic: q.Get("topic"), Since: q.Get("since"),
	}
	if len(f.ID) > 500 {
		return f, searchError{"id", "longer than 500 characters: not an id"}
	}
	var err error
	if s := strings.TrimSpace(q.Get("from")); s != "" {
		if f.from, err = parseUTC("from", s); err != nil {
			return f, err
		}
	}
	if s := strings.TrimSpace(q.Get("to")); s != "" {
		if f.to, err = parseUTC("to", s); err != nil {
			return f, err
		}
	}
	if f.Since != "" {
		d, ok := time.Duration(0), false
		for _, p := range searchPresets {
			if p.Key == f.Since {
				d, _ = time.ParseDuration(p.Key)
				ok = true
			}
		}
		switch {
		case !ok:
			return f, searchError{"since", fmt.Sprintf("%q is not one of 15m, 1h, 24h", f.Since)}
		case !f.from.IsZero():
			return f, searchError{"since", "give since or from, not both"}
		}
		f.from = now.Add(-d).UTC().Truncate(time.Second)
	}
	if !f.from.IsZero() && !f.to.IsZero() && !f.from.Before(f.to) {
		return f, searchError{"from", fmt.Sprintf("%s is not before to (%s)", f.from.Format(formLayout), f.to.Format(formLayout))}
	}
	if !f.from.IsZero() {
		f.From = f.from.Format(formLayout)
	}
	if !f.to.IsZero() {
		f.To = f.to.Format(formLayout)
	}
	after, before := q.Get("after"), q.Get("before")
	switch {
	case after != "" && before != "":
		return f, searchError{"after", "give after or before, not both"}
	case before != "":
		p, err := parsePosition("before", before)
		if err != nil {
			return f, searchError{"before", err.Error()}
		}
		f.before = &p
	case after != "":
		p, err := parsePosition("after", after)
		if err != nil {
			return f, searchError{"after", err.Error()}
		}
		f.after = &p
	}
	return f, nil
}

// Link is the search's URL with the same criteria (the window as
// absolute times: a page's links stay on the window it was opened with),
// and kv's pairs (the pager's position).
func (f searchForm) Link(kv ...string) string {
	v := url.Values{}
	for k, s := range map[string]string{"id": f.ID, "aggregate_type": f.AggregateType, "merchant": f.Merchant,
		"event_type": f.EventType, "topic": f.Topic, "from": f.From, "to": f.To} {
		if s != "" {
			v.Set(k, s)
		}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			v.Del(kv[i])
		} else {
			v.Set(kv[i], kv[i+1])
		}
	}
	return "/search?" + v.Encode()
}

// PresetLink is the search with the window of a preset, up to now.
func (f searchForm) PresetLink(key string) string {
	f.From, f.To = "", ""
	return f.Link("since", key)
}

// searchChoices are what the filters offer.
type searchChoices struct {
	EventTypes, Topics, AggregateTypes []string
	// Merchants to choose from; nil with more than merchantsMax (the
	// filter takes an id) or without the app's tables.
	Merchants []merchantChoice
	// ManyMerchants: more than merchantsMax, the filter takes an id.
	ManyMerchants bool
}

type merchantChoice struct{ ID, Name string }

// choicesCache keeps the choices read from the outbox for searchChoicesTTL.
type choicesCache struct {
	mu                        sync.Mutex
	at                        time.Time
	types, topics, aggregates []string
}

type searchRow struct {
	ID               int64
	MessageID        string
	Topic            string
	EventType        string
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	CreatedAt        time.Time
	State            string
	ParkedAt         *time.Time

	hit bool
	k   int64
}

func (r searchRow) pos() position { return position{r.AggregateVersion, r.ID} }

// searchResult is a page of a search.
type searchResult struct {
	Form    searchForm
	Choices searchChoices
	Rows    []searchRow
	// Next, Previous: the before=, after= of the neighbouring pages;
	// empty when there is none. Positioned: not the first page.
	Next, Previous string
	Positioned     bool
	// Budget: the page stopped after reading searchBudget rows, back to
	// ScannedTo, before it found a page of matches.
	Budget    bool
	ScannedTo time.Time
	// Count is the number of matches when it was cheap to count (-1 when
	// not), Capped when it reached searchCountMax.
	Count  int64
	Capped bool
	// Walk says how the search found its rows, for the page's note.
	Walk string
	// MerchantName of the merchant searched.
	MerchantName string
	// FrameworkOnly: no merchants (the reference app's tables are absent).
	FrameworkOnly bool
}

// Presets are the one-click windows.
func (searchResult) Presets() []struct{ Key, Label string } { return searchPresets }

// BudgetRows is how many rows a page reads at most.
func (searchResult) BudgetRows() int { return searchBudget }

// MerchantLabel is how the page names the merchant of a row's filter.
func (r searchResult) MerchantLabel() string {
	if r.MerchantName != "" {
		return r.MerchantName + " (" + r.Form.Merchant + ")"
	}
	return r.Form.Merchant
}

func (c *Console) searchPage(w http.ResponseWriter, r *http.Request, s session) {
	p := c.pageFor(s, "Search events")
	res, err := c.search(r.Context(), r.URL.Query())
	if se := (searchError{}); errors.As(err, &se) {
		http.Error(w, "bad search: "+se.Error(), http.StatusBadRequest)
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	p.Data = res
	c.render(w, http.StatusOK, "search", p)
}

// search reads one page of a search: the criteria checked against what
// exists (a 400's searchError otherwise), the index to walk chosen, the
// window's ids found, the page read.
func (c *Console) search(ctx context.Context, q url.Values) (searchResult, error) {
	res := searchResult{Count: -1, FrameworkOnly: c.cfg.FrameworkOnly}
	f, err := parseSearch(q, c.now())
	res.Form = f
	if err != nil {
		return res, err
	}
	if res.Choices, err = c.searchChoices(ctx); err != nil {
		return res, err
	}
	ch := res.Choices
	if f.EventType != "" && !slices.Contains(ch.EventTypes, f.EventType) {
		return res, searchError{"event_type", fmt.Sprintf("unknown event type %q: choose one of those the list offers "+
			"(those of the newest events and of samples of the older ones, and the configured ones: Config.EventTypes)", f.EventType)}
	}
	if f.Topic != "" && !slices.Contains(ch.Topics, f.Topic) {
		return res, searchError{"topic", fmt.Sprintf("unknown topic %q: choose one of those the list offers", f.Topic)}
	}
	if f.AggregateType != "" && !slices.Contains(ch.AggregateTypes, f.AggregateType) {
		// Not among the samples: the aggregate index knows for sure (the
		// journey links to the search of its aggregate, whatever its type).
		var n int
		if err := c.cfg.Pool.QueryRow(ctx, qAggregateTypeExists, f.AggregateType).Scan(&n); err != nil {
			return res, fmt.Errorf("search: find aggregate type: %w", err)
		}
		if n == 0 {
			return res, searchError{"aggregate_type", fmt.Sprintf("unknown aggregate type %q: no event has it", f.AggregateType)}
		}
		res.Choices.AggregateTypes = union(ch.AggregateTypes, []string{f.AggregateType})
	}
	spec := searchSpec{asc: f.after != nil, eventType: f.EventType != "", topic: f.Topic != "", from: !f.from.IsZero(), to: !f.to.IsZero()}
	args := pgx.NamedArgs{"lo": int64(0), "hi": int64(math.MaxInt64), "budget": searchBudget, "limit": c.cfg.PageSize + 1,
		"count_max": searchCountMax + 1, "payment_type": paymentevents.AggregateType,
		"event_type": f.EventType, "topic": f.Topic, "from": f.from, "to": f.to}
	pool := c.cfg.Pool
	if f.Merchant != "" {
		if c.cfg.FrameworkOnly {
			return res, searchError{"merchant", "merchants are the reference app's, whose tables this database does not have"}
		}
		m, err := uuid.Parse(f.Merchant)
		if err != nil {
			return res, searchError{"merchant", fmt.Sprintf("%q is not a merchant id (a UUID)", f.Merchant)}
		}
		err = pool.QueryRow(ctx, qMerchant, m).Scan(&res.MerchantName)
		if errors.Is(err, pgx.ErrNoRows) {
			return res, searchError{"merchant", fmt.Sprintf("no merchant %s", m)}
		}
		if err != nil {
			return res, fmt.Errorf("search: read merchant: %w", err)
		}
		spec.merc = true
		args["merchant"] = m
	}
	// The index to walk: the message, else the aggregate, else a merchant's
	// payments when they are few, else the primary key.
	switch {
	case f.ID != "":
		spec.mode = byAggregate
		args["aggregate_type"], args["aggregate_id"] = orDefault(f.AggregateType, c.cfg.AggregateType), f.ID
		res.Walk = "the events of " + orDefault(f.AggregateType, c.cfg.AggregateType) + " " + f.ID
		if id, err := uuid.Parse(f.ID); err == nil {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM (`+qFindMessage+`) m`, id).Scan(&n); err != nil {
				return res, fmt.Errorf("search: find message: %w", err)
			}
			if n > 0 {
				spec.mode = byMessage
				args["message_id"] = id
				res.Walk = "the message " + f.ID
			}
		}
	case spec.merc:
		rows, err := pool.Query(ctx, qMerchantPayments, args["merchant"], merchantPaymentsMax+1)
		if err != nil {
			return res, fmt.Errorf("search: read merchant's payments: %w", err)
		}
		payments, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return res, fmt.Errorf("search: read merchant's payments: %w", err)
		}
		if len(payments) <= merchantPaymentsMax {
			spec.mode = byPayments
			args["payments"] = payments
			res.Walk = fmt.Sprintf("the events of the merchant's %s payment(s)", thousands(int64(len(payments))))
		} else {
			res.Walk = "the newest events, each looked up in the merchant's payments (it has more than " + thousands(merchantPaymentsMax) + ")"
		}
	default:
		res.Walk = "the newest events"
	}
	if spec.from || spec.to {
		lo, hi, err := c.windowIDs(ctx, f.from, f.to)
		if err != nil {
			return res, err
		}
		args["lo"], args["hi"] = lo, hi
		if res.Walk == "the newest events" {
			res.Walk = "the events of the window"
		}
	}
	switch {
	case f.before != nil:
		args["pos_version"], args["pos_id"] = f.before.Version, f.before.ID
	case f.after != nil:
		args["pos_version"], args["pos_id"] = f.after.Version, f.after.ID
	default:
		args["pos_version"], args["pos_id"] = int64(math.MaxInt64), int64(math.MaxInt64)
	}
	rows, err := pool.Query(ctx, spec.pageSQL(), args)
	if err != nil {
		return res, fmt.Errorf("search: read events: %w", err)
	}
	read, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (searchRow, error) {
		var s searchRow
		err := r.Scan(&s.ID, &s.MessageID, &s.Topic, &s.EventType, &s.AggregateType, &s.AggregateID, &s.AggregateVersion,
			&s.CreatedAt, &s.State, &s.ParkedAt, &s.hit, &s.k)
		return s, err
	})
	if err != nil {
		return res, fmt.Errorf("search: read events: %w", err)
	}
	res.page(read, c.cfg.PageSize, f)
	if spec.mode != byRange {
		// Bounded by the message, the aggregate or the merchant's few
		// payments: a count costs what the page did, at most.
		if err := pool.QueryRow(ctx, spec.countSQL(), args).Scan(&res.Count); err != nil {
			return res, fmt.Errorf("search: count events: %w", err)
		}
		if res.Count > searchCountMax {
			res.Count, res.Capped = searchCountMax, true
		}
	}
	return res, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// page cuts what a page's query read (in the walk's order: newest first,
// oldest first for after=) to the page, newest first, and sets the pager.
func (res *searchResult) page(read []searchRow, n int, f searchForm) {
	var hits []searchRow
	var marker *searchRow
	for i := range read {
		if read[i].hit {
			hits = append(hits, read[i])
		}
		if read[i].k == searchBudget {
			marker = &read[i]
		}
	}
	// beyond is where the walk goes on from, nil when it read everything.
	var beyond *position
	switch {
	case len(hits) > n:
		hits = hits[:n]
		p := hits[n-1].pos()
		beyond = &p
	case marker != nil:
		p := marker.pos()
		beyond = &p
		res.Budget, res.ScannedTo = true, marker.CreatedAt
	}
	res.Positioned = f.before != nil || f.after != nil
	if f.after != nil {
		slices.Reverse(hits)
		if beyond != nil {
			res.Previous = beyond.String()
		}
		if len(hits) > 0 {
			res.Next = hits[len(hits)-1].pos().String()
		} else {
			res.Next = position{f.after.Version, f.after.ID + 1}.String()
		}
	} else {
		if beyond != nil {
			res.Next = beyond.String()
		}
		switch {
		case f.before == nil:
		case len(hits) > 0:
			res.Previous = hits[0].pos().String()
		default:
			res.Previous = position{f.before.Version, f.before.ID - 1}.String()
		}
	}
	res.Rows = hits
}

// windowIDs are the ids [lo, hi) of the rows created in [from, to) (a
// zero bound open), widened by windowSlack: each bound is found by a
// binary search of the primary key on created_at, which grows with id
// (but for windowSlack), a probe of one row an iteration.
func (c *Console) windowIDs(ctx context.Context, from, to time.Time) (lo, hi int64, err error) {
	var minID, maxID *int64
	if err := c.cfg.Pool.QueryRow(ctx, qIDBounds).Scan(&minID, &maxID); err != nil {
		return 0, 0, fmt.Errorf("search: read the outbox's ids: %w", err)
	}
	if minID == nil {
		return 0, 0, nil
	}
	lo, hi = 0, math.MaxInt64
	if !from.IsZero() {
		if lo, err = c.firstIDAt(ctx, *minID, *maxID+1, from.Add(-windowSlack)); err != nil {
			return 0, 0, err
		}
	}
	if !to.IsZero() {
		if hi, err = c.firstIDAt(ctx, *minID, *maxID+1, to.Add(windowSlack)); err != nil {
			return 0, 0, err
		}
	}
	return lo, hi, nil
}

// firstIDAt is the first id in [lo, hi) of a row created at or after t,
// hi when there is none, were created_at in id order: every row below it
// was created before t, to within a transaction's length.
func (c *Console) firstIDAt(ctx context.Context, lo, hi int64, t time.Time) (int64, error) {
	for range 128 { // log2 of the ids' range, and then some: never a loop
		if lo >= hi {
			return hi, nil
		}
		mid := lo + (hi-lo)/2
		var (
			id      int64
			created time.Time
		)
		err := c.cfg.Pool.QueryRow(ctx, qIDProbe, mid, hi).Scan(&id, &created)
		switch {
		case errors.Is(err, pgx.ErrNoRows): // no row in [mid, hi)
			hi = mid
		case err != nil:
			return 0, fmt.Errorf("search: find the ids of the time window: %w", err)
		case !created.Before(t):
			hi = id
		default:
			lo = id + 1
		}
	}
	return hi, nil
}

// searchChoices reads what the filters offer: the event types, topics and
// aggregate types of the newest searchChoicesRows outbox rows and of
// samples spread over the outbox's history (kept for
// searchChoicesTTL, and every one seen since the console started), with
// Config.EventTypes, the consumers' topics and Config.AggregateType; the
// merchants, with the app's tables.
func (c *Console) searchChoices(ctx context.Context) (searchChoices, error) {
	var ch searchChoices
	cc := &c.choices
	cc.mu.Lock()
	stale := c.now().Sub(cc.at) > searchChoicesTTL
	cc.mu.Unlock()
	if stale {
		var minID, maxID *int64
		if err := c.cfg.Pool.QueryRow(ctx, qIDBounds).Scan(&minID, &maxID); err != nil {
			return ch, fmt.Errorf("search: read the outbox's ids: %w", err)
		}
		var types, topics, aggs []string
		if maxID != nil {
			step := max(1, (*maxID-*minID)/searchChoicesSamples)
			err := c.cfg.Pool.QueryRow(ctx, qSearchChoices, *maxID-searchChoicesRows, searchChoicesRows,
				*minID, step, searchChoicesSamples, searchChoicesSample).Scan(&types, &topics, &aggs)
			if err != nil {
				return ch, fmt.Errorf("search: read event types: %w", err)
			}
		}
		cc.mu.Lock()
		cc.types, cc.topics, cc.aggregates = union(cc.types, types), union(cc.topics, topics), union(cc.aggregates, aggs)
		cc.at = c.now()
		cc.mu.Unlock()
	}
	cc.mu.Lock()
	ch.EventTypes = union(cc.types, c.cfg.EventTypes)
	ch.Topics = slices.Clone(cc.topics)
	ch.AggregateTypes = union(cc.aggregates, []string{c.cfg.AggregateType})
	cc.mu.Unlock()
	for _, cs := range c.cfg.Consumers {
		ch.Topics = union(ch.Topics, []string{cs.Topic})
	}
	if c.cfg.FrameworkOnly {
		return ch, nil
	}
	rows, err := c.cfg.Pool.Query(ctx, qMerchants, uuid.Nil, merchantsMax+1)
	if err != nil {
		return ch, fmt.Errorf("search: read merchants: %w", err)
	}
	var m merchantChoice
	if _, err := pgx.ForEachRow(rows, []any{&m.ID, &m.Name}, func() error {
		ch.Merchants = append(ch.Merchants, m)
		return nil
	}); err != nil {
		return ch, fmt.Errorf("search: read merchants: %w", err)
	}
	if len(ch.Merchants) > merchantsMax {
		ch.Merchants, ch.ManyMerchants = nil, true
	}
	slices.SortFunc(ch.Merchants, func(a, b merchantChoice) int { return strings.Compare(a.Name, b.Name) })
	return ch, nil
}

// maxChoices bounds each list of choices kept: a producer writing an event
// type per row must not grow the console without end.
const maxChoices = 1000

// union is a and b's strings, sorted, without duplicates and empties, at
// most maxChoices.
func union(a, b []string) []string {
	out := make([]string, 0, len(a)+len(b))
	for _, s := range append(slices.Clone(a), b...) {
		if s != "" {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > maxChoices {
		out = out[:maxChoices]
	}
	return out
}
