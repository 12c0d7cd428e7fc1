package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
)

// Lists page by keyset (id > after, or id < before for the page before),
// never by OFFSET: a page costs the same however deep it is, and so do
// its counts (listquery.go).

type listPage[T any] struct {
	Rows []T
	Next int64 // the after= of the next page; 0 when this is the last
	Prev int64 // the before= of the previous page; 0 when this is the first
	// Filter of the dead letters' list.
	Consumer, Status string
	// Filter of the parked rows' list.
	Topic string
	// Error filters either list by the exact error text.
	Error string
	// Known are the values the consumer or topic filter offers; Note says
	// how the filter's value was read (a case-insensitive match), Hint
	// that it matches no known value, and what it may have meant.
	Known      []string
	Note, Hint string
	Pager      pager
	// At is the row the address asked for (at=), marked.
	At int64
	// ErrorPanel is the filter's errors, grouped.
	ErrorPanel errorPanel
	All        allSet
	// NotInstalled: the list's table is the reference app's, and not in
	// this database.
	NotInstalled bool
}

// pager is a list's position and its links.
type pager struct {
	Showing           string
	First, Prev, Next string // "" when there is none
}

// allSet is what a list's "all matching the filter" buttons act on: the
// rows matching the filter up to Through, the newest when the page was
// read, so that what arrives later is not touched.
type allSet struct {
	Count             capped
	Through           int64
	RetryQ, DiscardQ  string // the browser's confirm() questions
	Offered           bool
	FilterDescription string
}

// cut keeps the first n rows of a read that asked for n+1, and points Next
// at the id of the last kept when there was one more.
func (lp *listPage[T]) cut(n int, id func(T) int64) {
	if len(lp.Rows) > n {
		lp.Rows = lp.Rows[:n]
		lp.Next = id(lp.Rows[n-1])
	}
}

func afterParam(r *http.Request, name string) int64 {
	v, err := strconv.ParseInt(r.URL.Query().Get(name), 10, 64)
	if err != nil || v < 0 {
		return 0
	}
	return v
}

// keyset is where a list's page starts: after an id, or before one; at
// is the row a link asked for, marked on the page.
type keyset struct {
	after, before, at int64
}

// errBadKeyset names a list's after= or before= that cannot be a position.
var errBadKeyset = errors.New("bad page position")

func keysetOf(r *http.Request) (keyset, error) {
	q := r.URL.Query()
	var k keyset
	for _, p := range []struct {
		name string
		to   *int64
	}{{"after", &k.after}, {"before", &k.before}} {
		v := q.Get(p.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return k, fmt.Errorf("%w: %s must be a row id, got %q", errBadKeyset, p.name, v)
		}
		*p.to = n
	}
	if v := q.Get("at"); v != "" {
		// A link to one row (from its journey, say): the page that
		// starts at it, the row marked.
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return k, fmt.Errorf("%w: at must be a row id, got %q", errBadKeyset, v)
		}
		if k.after != 0 || k.before != 0 {
			return k, fmt.Errorf("%w: give at, after or before, one of them", errBadKeyset)
		}
		k.after, k.at = n-1, n
		if k.after == 0 {
			k.after = -1 // the first row: still a position, not the first page's link
		}
	}
	if k.after != 0 && k.before != 0 {
		return k, fmt.Errorf("%w: give after or before, not both", errBadKeyset)
	}
	return k, nil
}

// fillPage fills lp's rows, and its pager but for the links, from a read of
// n+1 rows at k (newest first for a before= page), with rank counting the
// rows before the first and total every row.
func fillPage[T any](lp *listPage[T], read []T, n int, k keyset, id func(T) int64,
	rank func(first int64) (capped, error), total capped,
) error {
	if k.before != 0 {
		more := len(read) > n
		if more {
			read = read[:n]
		}
		slices.Reverse(read)
		lp.Rows = read
		if more {
			lp.Prev = id(read[0])
		}
		if len(read) > 0 {
			lp.Next = id(read[len(read)-1])
		}
	} else {
		lp.Rows = read
		lp.cut(n, id)
	}
	if len(lp.Rows) == 0 {
		lp.Pager.Showing = "No row here, of " + total.String() + " matching."
		return nil
	}
	var before capped
	if k.after != 0 || k.before != 0 {
		var err error
		if before, err = rank(id(lp.Rows[0])); err != nil {
			return err
		}
	}
	if k.after != 0 && (before.N > 0 || before.Capped) {
		lp.Prev = id(lp.Rows[0])
	}
	if k.before != 0 && !total.Capped && !before.Capped && before.N+int64(len(lp.Rows)) >= total.N {
		lp.Next = 0 // the last page
	}
	if before.Capped {
		lp.Pager.Showing = fmt.Sprintf("Showing %s past the first %s, of %s", plural(int64(len(lp.Rows)), "row", "rows"), thousands(countCap), total)
	} else {
		lp.Pager.Showing = fmt.Sprintf("Showing %s–%s of %s", thousands(before.N+1), thousands(before.N+int64(len(lp.Rows))), total)
	}
	return nil
}

// links sets the pager's links: base is the list's URL with its filter.
func (p *pager) links(base url.Values, path string, prev, next int64, firstPage bool) {
	link := func(k string, v int64) string {
		q := url.Values{}
		for key, vs := range base {
			if len(vs) > 0 && vs[0] != "" {
				q[key] = vs
			}
		}
		if k != "" {
			q.Set(k, strconv.FormatInt(v, 10))
		}
		if len(q) == 0 {
			return path
		}
		return path + "?" + q.Encode()
	}
	if !firstPage {
		p.First = link("", 0)
	}
	if prev != 0 {
		p.Prev = link("before", prev)
	}
	if next != 0 {
		p.Next = link("after", next)
	}
}

// describeFilter writes a filter as the confirmations name it:
// consumer=sync-analytics, status=dead.
func describeFilter(kv ...string) string {
	var parts []string
	for i := 0; i+1 < len(kv); i += 2 {
		if v := kv[i+1]; v != "" {
			if kv[i] == "error" {
				v = strconv.Quote(shorten(v, 80))
			}
			parts = append(parts, kv[i]+"="+v)
		}
	}
	return strings.Join(parts, ", ")
}

// shorten cuts s to n runes, with an ellipsis.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func (f parkedFilter) values() url.Values {
	return url.Values{"topic": {f.Topic}, "error": {f.Error}}
}

func (c *Console) readParked(ctx context.Context, f parkedFilter, k keyset) (listPage[forwarder.ParkedRow], error) {
	lp := listPage[forwarder.ParkedRow]{}
	known, err := c.knownTopics(ctx)
	if err != nil {
		return lp, err
	}
	lp.Known = known
	f.Topic, lp.Note, lp.Hint = resolveName("topic", f.Topic, known)
	lp.Topic, lp.Error = f.Topic, f.Error
	if lp.Hint != "" {
		lp.Known = append(lp.Known, f.Topic) // the select shows the filter it lists
	}
	n := c.cfg.PageSize
	q, args := qParked, f.args(pgx.NamedArgs{"after": k.after, "limit": n + 1})
	if k.before != 0 {
		q, args = qParkedBefore, f.args(pgx.NamedArgs{"before": k.before, "limit": n + 1})
	}
	rows, err := c.cfg.Pool.Query(ctx, q, args)
	if err != nil {
		return lp, fmt.Errorf("list parked rows: %w", err)
	}
	read, err := pgx.CollectRows(rows, pgx.RowToStructByPos[forwarder.ParkedRow])
	if err != nil {
		return lp, fmt.Errorf("list parked rows: %w", err)
	}
	total, err := c.countRows(ctx, parkedCountQuery(""), f.args(nil), countCap)
	if err != nil {
		return lp, fmt.Errorf("count parked rows: %w", err)
	}
	rank := func(first int64) (capped, error) {
		return c.countRows(ctx, parkedCountQuery("f.id < @first"), f.args(pgx.NamedArgs{"first": first}), countCap)
	}
	if err := fillPage(&lp, read, n, k, func(r forwarder.ParkedRow) int64 { return r.ID }, rank, total); err != nil {
		return lp, fmt.Errorf("count parked rows: %w", err)
	}
	lp.Pager.links(f.values(), "/parked", lp.Prev, lp.Next, k == keyset{})
	lp.At = k.at
	errs := parkedFilter{Topic: f.Topic}
	ep := errorPanel{Of: errorsOf(total, f.Error == ""), Active: f.Error, path: "/parked", base: errs.values()}
	if ep.Groups, err = c.readErrorGroups(ctx, qParkedErrors, errs.args(nil)); err != nil {
		return lp, fmt.Errorf("group parked rows' errors: %w", err)
	}
	lp.ErrorPanel = ep
	// Every parked row can be retried or discarded: the set of "all" is
	// the list's.
	all := &lp.All
	if err := c.cfg.Pool.QueryRow(ctx, qParkedMax, f.args(nil)).Scan(&all.Through); err != nil {
		return lp, fmt.Errorf("read newest parked row: %w", err)
	}
	all.Count, all.Offered = total, total.N > 0
	all.FilterDescription = describeFilter("topic", f.Topic, "error", f.Error)
	all.RetryQ = allQuestion("Retry", all.Count, "parked row", all.FilterDescription, "of every topic") +
		" They go back in line with a fresh count of attempts."
	all.DiscardQ = allQuestion("Discard", all.Count, "parked row", all.FilterDescription, "of every topic") +
		" Consumers receive a discard marker instead of each event: their handler is not run for it, and the aggregates' later events flow."
	return lp, nil
}

// errorPanel is a list's errors grouped by message, each a link that
// filters the list by it.
type errorPanel struct {
	Groups []errorGroup
	Of     string // which rows were grouped
	Active string // the error the list is filtered by
	path   string
	base   url.Values
}

// Link is the list filtered by err (its other filters kept).
func (p errorPanel) Link(err string) string {
	q := url.Values{}
	for k, vs := range p.base {
		if len(vs) > 0 && vs[0] != "" {
			q[k] = vs
		}
	}
	q.Set("error", err)
	return p.path + "?" + q.Encode()
}

// errorsOf says which rows the errors panel grouped.
func errorsOf(total capped, unfiltered bool) string {
	if !unfiltered {
		return "of the filter without its error"
	}
	if total.Capped || total.N > errorWindow {
		return "among the latest " + thousands(errorWindow) + " matching rows"
	}
	return "among the " + plural(total.N, "matching row", "matching rows")
}

// allQuestion is the confirmation of an action on all matching a filter:
// "Retry all 1,234 dead letters matching consumer=sync-analytics,
// status=dead?".
func allQuestion(verb string, n capped, noun, filter, unfiltered string) string {
	what := "all " + n.String() + " " + noun + "s"
	if n.N == 1 && !n.Capped {
		what = "the 1 " + noun
	}
	if filter == "" {
		return verb + " " + what + " " + unfiltered + "?"
	}
	return verb + " " + what + " matching " + filter + "?"
}

func (c *Console) parkedPage(w http.ResponseWriter, r *http.Request, s session) {
	q := r.URL.Query()
	k, err := keysetOf(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	lp, err := c.readParked(r.Context(), parkedFilter{Topic: q.Get("topic"), Error: q.Get("error")}, k)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	p := c.pageFor(s, "Parked outbox rows")
	p.Data = lp
	if p.Result, err = c.doneAction(r); err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, http.StatusOK, "parked", p)
}

// openStatuses are the statuses of the dead letters that wait: the
// statuses of the partial indexes' predicate.
var openStatuses = []string{"retrying", "dead", "held"}

// errBadStatus names the /dead list's status filter when it is not an open
// status.
var errBadStatus = fmt.Errorf("status must be empty or one of %s", strings.Join(openStatuses, ", "))

func (f deadFilter) values() url.Values {
	return url.Values{"consumer": {f.Consumer}, "status": {f.Status}, "error": {f.Error}}
}

func (c *Console) readDead(ctx context.Context, f deadFilter, k keyset) (listPage[idempotency.DeadLetter], error) {
	lp := listPage[idempotency.DeadLetter]{}
	if f.Status != "" && !slices.Contains(openStatuses, f.Status) {
		return lp, errBadStatus
	}
	known, err := c.knownConsumers(ctx)
	if err != nil {
		return lp, err
	}
	lp.Known = known
	f.Consumer, lp.Note, lp.Hint = resolveName("consumer", f.Consumer, known)
	if lp.Hint != "" {
		lp.Known = append(lp.Known, f.Consumer)
	}
	lp.Consumer, lp.Status, lp.Error = f.Consumer, f.Status, f.Error
	byC, byE, sts := f.Consumer != "", f.Error != "", f.statuses()
	n := c.cfg.PageSize
	args := f.args(pgx.NamedArgs{"after": k.after, "before": k.before, "limit": n + 1})
	rows, err := c.cfg.Pool.Query(ctx, deadPageQuery(byC, byE, sts, k.before != 0), args)
	if err != nil {
		return lp, fmt.Errorf("list dead letters: %w", err)
	}
	read, err := pgx.CollectRows(rows, pgx.RowToStructByPos[idempotency.DeadLetter])
	if err != nil {
		return lp, fmt.Errorf("list dead letters: %w", err)
	}
	total, each, err := c.statusCounts(ctx, deadStatusCountsQuery(byC, byE, sts), f.args(nil), sts, countCap)
	if err != nil {
		return lp, fmt.Errorf("count dead letters: %w", err)
	}
	rank := func(first int64) (capped, error) {
		return c.countRows(ctx, deadCountQuery(byC, byE, sts, "id < @first"), f.args(pgx.NamedArgs{"first": first}), countCap)
	}
	if err := fillPage(&lp, read, n, k, func(d idempotency.DeadLetter) int64 { return d.ID }, rank, total); err != nil {
		return lp, fmt.Errorf("count dead letters: %w", err)
	}
	lp.Pager.links(f.values(), "/dead", lp.Prev, lp.Next, k == keyset{})
	lp.At = k.at
	noErr := f
	noErr.Error = ""
	ep := errorPanel{Of: errorsOf(total, !byE), Active: f.Error, path: "/dead", base: noErr.values()}
	if ep.Groups, err = c.readErrorGroups(ctx, deadErrorsQuery(byC, sts), f.args(nil)); err != nil {
		return lp, fmt.Errorf("group dead letters' errors: %w", err)
	}
	lp.ErrorPanel = ep
	// Retry and discard act on dead letters of status dead only: under a
	// held or retrying filter, "all" offers nothing.
	all := &lp.All
	if f.Status != "" && f.Status != "dead" {
		return lp, nil
	}
	if err := c.cfg.Pool.QueryRow(ctx, deadMaxQuery(byC, byE), f.args(nil)).Scan(&all.Through); err != nil {
		return lp, fmt.Errorf("read newest dead letter: %w", err)
	}
	all.Count = each["dead"]
	all.Offered = all.Count.N > 0
	all.FilterDescription = describeFilter("consumer", f.Consumer, "status", "dead", "error", f.Error)
	all.RetryQ = allQuestion("Retry", all.Count, "dead letter", all.FilterDescription, "") +
		" The consumer tries them again at once."
	all.DiscardQ = allQuestion("Discard", all.Count, "dead letter", all.FilterDescription, "") +
		" They are recorded as handled without running the handler."
	return lp, nil
}

func (c *Console) deadPage(w http.ResponseWriter, r *http.Request, s session) {
	q := r.URL.Query()
	k, err := keysetOf(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	lp, err := c.readDead(r.Context(), deadFilter{Consumer: q.Get("consumer"), Status: q.Get("status"), Error: q.Get("error")}, k)
	if errors.Is(err, errBadStatus) {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	p := c.pageFor(s, "Dead letters")
	p.Data = lp
	if p.Result, err = c.doneAction(r); err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, http.StatusOK, "dead", p)
}
