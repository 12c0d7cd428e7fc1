package console

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
)

// Lists page by keyset (id > after), never by OFFSET: a page costs the
// same however deep it is.

const (
	// Parked rows are pending rows: through outbox_pending_idx. $3 is the
	// topic filter, '' for every topic.
	qParked = `
		SELECT id, message_id::text, topic, event_type, aggregate_type, aggregate_id, aggregate_version,
		       attempts, coalesce(last_error, ''), created_at, parked_at
		FROM outbox WHERE published_at IS NULL AND parked_at IS NOT NULL AND id > $1 AND ($3 = '' OR topic = $3)
		ORDER BY id LIMIT $2`
	qDeadLetters = `
		SELECT id, consumer, message_id::text, event_type, aggregate_type, aggregate_id, aggregate_version,
		       status, reason, error, attempts, next_attempt_at, created_at
		FROM dead_letters WHERE status = ANY($1) AND ($2 = '' OR consumer = $2) AND id > $3
		ORDER BY id LIMIT $4`
)

type listPage[T any] struct {
	Rows []T
	Next int64 // the after= of the next page; 0 when this is the last
	// Filter of the dead letters' list.
	Consumer, Status string
	// Filter of the parked rows' list.
	Topic string
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
	// Through outbox_pending_idx: parked rows are pending rows.
	rows, err := c.cfg.Pool.Query(ctx, qParked, after, c.cfg.PageSize+1, topic)
	if err != nil {
		return lp, fmt.Errorf("list parked rows: %w", err)
	}
	if lp.Rows, err = pgx.CollectRows(rows, pgx.RowToStructByPos[forwarder.ParkedRow]); err != nil {
		return lp, fmt.Errorf("list parked rows: %w", err)
	}
	if len(lp.Rows) > c.cfg.PageSize {
		lp.Rows = lp.Rows[:c.cfg.PageSize]
		lp.Next = lp.Rows[len(lp.Rows)-1].ID
	}
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

var openStatuses = []string{"retrying", "dead", "held"}

func (c *Console) readDead(ctx context.Context, consumer, status string, after int64) (listPage[idempotency.DeadLetter], error) {
	lp := listPage[idempotency.DeadLetter]{Consumer: consumer, Status: status}
	statuses := openStatuses
	for _, st := range openStatuses {
		if st == status {
			statuses = []string{status}
		}
	}
	rows, err := c.cfg.Pool.Query(ctx, qDeadLetters, statuses, consumer, after, c.cfg.PageSize+1)
	if err != nil {
		return lp, fmt.Errorf("list dead letters: %w", err)
	}
	if lp.Rows, err = pgx.CollectRows(rows, pgx.RowToStructByPos[idempotency.DeadLetter]); err != nil {
		return lp, fmt.Errorf("list dead letters: %w", err)
	}
	if len(lp.Rows) > c.cfg.PageSize {
		lp.Rows = lp.Rows[:c.cfg.PageSize]
		lp.Next = lp.Rows[len(lp.Rows)-1].ID
	}
	return lp, nil
}

func (c *Console) deadPage(w http.ResponseWriter, r *http.Request, s session) {
	q := r.URL.Query()
	lp, err := c.readDead(r.Context(), q.Get("consumer"), q.Get("status"), afterParam(r, "after"))
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

type action struct {
	ID          int64
	KeyID       string
	KeyName     string
	At          time.Time
	Action      string
	Target      string
	ResultCount int64
	Error       string
}

const actionColumns = `id, api_key_id::text, api_key_name, at, action, target::text, result_count, error`

// doneAction is the action named by ?done=, shown on the page an action
// returns to.
func (c *Console) doneAction(r *http.Request) (*action, error) {
	id := afterParam(r, "done")
	if id == 0 {
		return nil, nil
	}
	rows, err := c.cfg.Pool.Query(r.Context(), `SELECT `+actionColumns+` FROM console_actions WHERE id = $1`, id)
	if err != nil {
		return nil, fmt.Errorf("read console action: %w", err)
	}
	a, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[action])
	if err != nil {
		return nil, nil //nolint:nilerr // a stale or made-up id shows nothing
	}
	return &a, nil
}

func (c *Console) actionsPage(w http.ResponseWriter, r *http.Request, s session) {
	before := afterParam(r, "before")
	rows, err := c.cfg.Pool.Query(r.Context(), `SELECT `+actionColumns+` FROM console_actions
		WHERE ($1 = 0 OR id < $1) ORDER BY id DESC LIMIT $2`, before, c.cfg.PageSize+1)
	if err != nil {
		c.fail(w, r, fmt.Errorf("list console actions: %w", err))
		return
	}
	var lp listPage[action]
	if lp.Rows, err = pgx.CollectRows(rows, pgx.RowToStructByPos[action]); err != nil {
		c.fail(w, r, fmt.Errorf("list console actions: %w", err))
		return
	}
	if len(lp.Rows) > c.cfg.PageSize {
		lp.Rows = lp.Rows[:c.cfg.PageSize]
		lp.Next = lp.Rows[len(lp.Rows)-1].ID
	}
	p := c.pageFor(s, "Actions")
	p.Data = lp
	c.render(w, http.StatusOK, "actions", p)
}
