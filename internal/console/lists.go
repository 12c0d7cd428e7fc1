package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
)

// Lists page by keyset (id > after), never by OFFSET: a page costs the
// same however deep it is.

const (
	// Parked rows are in outbox_failures, the small table of the rows off
	// the normal path: through its primary key, each joined to its outbox
	// row by the outbox's (o.id > $1 too: whichever way the planner joins
	// them, neither is read from its start). $3 is the topic filter, ''
	// for every topic.
	qParked = `
		SELECT o.id, o.message_id::text, o.topic, o.event_type, o.aggregate_type, o.aggregate_id, o.aggregate_version,
		       f.attempts, coalesce(f.last_error, ''), o.created_at, f.parked_at, f.discarded_at
		FROM outbox_failures f JOIN outbox o ON o.id = f.id
		WHERE f.parked_at IS NOT NULL AND f.id > $1 AND o.id > $1 AND ($3 = '' OR o.topic = $3)
		ORDER BY f.id LIMIT $2`
)

// deadLettersQuery is the /dead list's query for a filter (consumer given
// or not, one open status or all three): one branch per status, each an
// ordered scan of a partial index of open dead letters in id order
// (dead_letters_open_consumer_status_idx with a consumer,
// dead_letters_open_status_idx without) that stops after @limit rows, then
// the branches' rows merged in id order. A single query over every open
// status would read and sort all of them for each page. The status is a
// literal, not a parameter: it is what proves a branch within the indexes'
// predicate, in a generic plan too. Arguments: @consumer (with one),
// @after, @limit.
func deadLettersQuery(byConsumer bool, statuses []string) string {
	branches := make([]string, len(statuses))
	for i, st := range statuses {
		cond := "status = '" + st + "'"
		if byConsumer {
			cond += " AND consumer = @consumer"
		}
		branches[i] = `(SELECT id, consumer, message_id::text, event_type, aggregate_type, aggregate_id, aggregate_version,
		       status, reason, error, attempts, next_attempt_at, created_at
		FROM dead_letters WHERE ` + cond + ` AND id > @after ORDER BY id LIMIT @limit)`
	}
	if len(branches) == 1 {
		return branches[0]
	}
	return `SELECT * FROM (` + strings.Join(branches, "\n\t\tUNION ALL ") + `) d ORDER BY id LIMIT @limit`
}

type listPage[T any] struct {
	Rows []T
	Next int64 // the after= of the next page; 0 when this is the last
	// Filter of the dead letters' list.
	Consumer, Status string
	// Filter of the parked rows' list.
	Topic string
	// NotInstalled: the list's table is the reference app's, and not in
	// this database.
	NotInstalled bool
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

func (c *Console) readParked(ctx context.Context, topic string, after int64) (listPage[forwarder.ParkedRow], error) {
	lp := listPage[forwarder.ParkedRow]{Topic: topic}
	// Through outbox_failures' primary key (qParked).
	rows, err := c.cfg.Pool.Query(ctx, qParked, after, c.cfg.PageSize+1, topic)
	if err != nil {
		return lp, fmt.Errorf("list parked rows: %w", err)
	}
	if lp.Rows, err = pgx.CollectRows(rows, pgx.RowToStructByPos[forwarder.ParkedRow]); err != nil {
		return lp, fmt.Errorf("list parked rows: %w", err)
	}
	lp.cut(c.cfg.PageSize, func(r forwarder.ParkedRow) int64 { return r.ID })
	return lp, nil
}

func (c *Console) parkedPage(w http.ResponseWriter, r *http.Request, s session) {
	lp, err := c.readParked(r.Context(), r.URL.Query().Get("topic"), afterParam(r, "after"))
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

func (c *Console) readDead(ctx context.Context, consumer, status string, after int64) (listPage[idempotency.DeadLetter], error) {
	lp := listPage[idempotency.DeadLetter]{Consumer: consumer, Status: status}
	statuses := openStatuses
	if status != "" {
		if !slices.Contains(openStatuses, status) {
			return lp, errBadStatus
		}
		statuses = []string{status}
	}
	q := deadLettersQuery(consumer != "", statuses)
	rows, err := c.cfg.Pool.Query(ctx, q, pgx.NamedArgs{"consumer": consumer, "after": after, "limit": c.cfg.PageSize + 1})
	if err != nil {
		return lp, fmt.Errorf("list dead letters: %w", err)
	}
	if lp.Rows, err = pgx.CollectRows(rows, pgx.RowToStructByPos[idempotency.DeadLetter]); err != nil {
		return lp, fmt.Errorf("list dead letters: %w", err)
	}
	lp.cut(c.cfg.PageSize, func(d idempotency.DeadLetter) int64 { return d.ID })
	return lp, nil
}

func (c *Console) deadPage(w http.ResponseWriter, r *http.Request, s session) {
	q := r.URL.Query()
	lp, err := c.readDead(r.Context(), q.Get("consumer"), q.Get("status"), afterParam(r, "after"))
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
