package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/replay"
)

// maxSelection bounds the ids one action names.
const maxSelection = 1000

// selection is what an action's form names: some ids, or every row
// matching the list's filter.
type selection struct {
	IDs      []int64 `json:"ids,omitempty"`
	All      bool    `json:"all,omitempty"`
	Consumer string  `json:"consumer,omitempty"`
	Status   string  `json:"status,omitempty"`
	// Topic is the parked rows' filter.
	Topic string `json:"topic,omitempty"`
}

func parseSelection(r *http.Request) (selection, error) {
	sel := selection{All: r.PostFormValue("all") == "1", Consumer: r.PostFormValue("consumer"), Status: r.PostFormValue("status"),
		Topic: r.PostFormValue("topic")}
	ids := r.PostForm["id"]
	if len(ids) > maxSelection {
		return sel, fmt.Errorf("at most %d rows at once", maxSelection)
	}
	for _, v := range ids {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			return sel, fmt.Errorf("invalid id %q", v)
		}
		sel.IDs = append(sel.IDs, id)
	}
	if !sel.All && len(sel.IDs) == 0 {
		return sel, errors.New("select at least one row, or all")
	}
	return sel, nil
}

// confirmData is the confirmation page: the same form again, with
// confirm=yes.
type confirmData struct {
	Action   string // the form's URL
	What     string
	Back     string
	Fields   url.Values
	Selected int
	All      bool
}

// act runs one action in two steps: without confirm=yes it shows what it
// would do and asks; with it, it runs do, records it in console_actions
// (who, when, what, on what, how many) and returns to back(sel), the list
// it came from, with ?done=.
func (c *Console) act(w http.ResponseWriter, r *http.Request, s session, name, what string, back func(selection) string,
	do func(ctx context.Context, sel selection) (int64, error),
) {
	sel, err := parseSelection(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// The record names what the action applied to: chosen ids ignore the
	// list's filter, so it is not recorded with them.
	target := sel
	if !sel.All {
		target.Consumer, target.Status, target.Topic = "", "", ""
	}
	c.confirmThenDo(w, r, s, name, what, back(sel), target, len(sel.IDs), sel.All, func(ctx context.Context) (int64, error) { return do(ctx, sel) })
}

// confirmThenDo asks for confirmation (without confirm=yes), or runs do
// and records it with target.
func (c *Console) confirmThenDo(w http.ResponseWriter, r *http.Request, s session, name, what, back string,
	target any, selected int, all bool, do func(ctx context.Context) (int64, error),
) {
	if r.PostFormValue("confirm") != "yes" {
		fields := url.Values{}
		for k, v := range r.PostForm {
			if k != CSRFField && k != "confirm" {
				fields[k] = v
			}
		}
		p := c.pageFor(s, "Confirm")
		p.Data = confirmData{Action: r.URL.Path, What: what, Back: back, Fields: fields, Selected: selected, All: all}
		c.render(w, http.StatusOK, "confirm", p)
		return
	}
	n, doErr := do(r.Context())
	errText := ""
	if doErr != nil {
		errText = doErr.Error()
	}
	targetJSON, err := json.Marshal(target)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	var id int64
	err = c.cfg.Pool.QueryRow(r.Context(), `
		INSERT INTO console_actions (api_key_id, api_key_name, action, target, result_count, error)
		VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`, s.keyID, s.keyName, name, targetJSON, n, errText).Scan(&id)
	if err != nil {
		c.fail(w, r, fmt.Errorf("record console action: %w", err))
		return
	}
	c.log.Info("console: action", "action", name, "api_key_id", s.keyID, "rows", n, "error", errText)
	u, _ := url.Parse(back)
	q := u.Query()
	q.Set("done", strconv.FormatInt(id, 10))
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.String(), http.StatusSeeOther)
}

func parkedBack(sel selection) string {
	if sel.Topic == "" {
		return "/parked"
	}
	return "/parked?" + url.Values{"topic": {sel.Topic}}.Encode()
}

func (c *Console) parkedRetry(w http.ResponseWriter, r *http.Request, s session) {
	c.act(w, r, s, "outbox.retry", "Retry parked outbox rows: they go back in line with a fresh count of attempts.", parkedBack,
		func(ctx context.Context, sel selection) (int64, error) {
			return c.releaseParked(ctx, sel, forwarder.RetryParked)
		})
}

// discardWhat is the discard's confirmation, and the template's: what a
// discard does, for the operator deciding.
const discardWhat = "Discard parked outbox rows: each event is replaced by a discard marker, which the forwarder publishes " +
	"in its place. Consumers receive the marker, not the event: their handler is not run for it, and the aggregate's later " +
	"events flow after it. The row is kept, marked discarded."

func (c *Console) parkedDiscard(w http.ResponseWriter, r *http.Request, s session) {
	c.act(w, r, s, "outbox.discard", discardWhat, parkedBack,
		func(ctx context.Context, sel selection) (int64, error) {
			return c.releaseParked(ctx, sel, forwarder.DiscardParked)
		})
}

// releaseParked applies release (retry or discard) to the selected rows,
// or to every parked row of the selection's topic filter.
func (c *Console) releaseParked(ctx context.Context, sel selection,
	release func(context.Context, *pgxpool.Pool, forwarder.ParkedFilter) (int64, error),
) (int64, error) {
	if sel.All {
		return release(ctx, c.cfg.Pool, forwarder.ParkedFilter{Topic: sel.Topic})
	}
	var total int64
	for _, id := range sel.IDs {
		n, err := release(ctx, c.cfg.Pool, forwarder.ParkedFilter{ID: id})
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

func deadBack(sel selection) string {
	q := url.Values{}
	if sel.Consumer != "" {
		q.Set("consumer", sel.Consumer)
	}
	if sel.Status != "" {
		q.Set("status", sel.Status)
	}
	if len(q) == 0 {
		return "/dead"
	}
	return "/dead?" + q.Encode()
}

func (c *Console) deadRetry(w http.ResponseWriter, r *http.Request, s session) {
	c.act(w, r, s, "dlq.retry", "Retry dead letters: the consumer tries them again at once.", deadBack,
		func(ctx context.Context, sel selection) (int64, error) {
			if sel.All {
				return idempotency.RetryDeadLetter(ctx, c.cfg.Pool, sel.Consumer, 0)
			}
			var total int64
			for _, id := range sel.IDs {
				n, err := idempotency.RetryDeadLetter(ctx, c.cfg.Pool, "", id)
				total += n
				if err != nil && !errors.Is(err, idempotency.ErrNotDead) {
					return total, err
				}
			}
			return total, nil
		})
}

func (c *Console) deadDiscard(w http.ResponseWriter, r *http.Request, s session) {
	c.act(w, r, s, "dlq.discard", "Discard dead letters: recorded as handled without running the handler; the events held behind them are released.", deadBack,
		func(ctx context.Context, sel selection) (int64, error) {
			ids := sel.IDs
			if sel.All {
				var err error
				if ids, err = c.deadIDs(ctx, sel.Consumer); err != nil {
					return 0, err
				}
			}
			var n int64
			for _, id := range ids {
				err := idempotency.DiscardDeadLetter(ctx, c.cfg.Pool, id)
				if errors.Is(err, idempotency.ErrNotDead) {
					continue
				}
				if err != nil {
					return n, err
				}
				n++
			}
			return n, nil
		})
}

// deadIDs lists the dead letters (status dead) of consumer, "" for all.
func (c *Console) deadIDs(ctx context.Context, consumer string) ([]int64, error) {
	rows, err := c.cfg.Pool.Query(ctx, `SELECT id FROM dead_letters WHERE status = 'dead' AND ($1 = '' OR consumer = $1) ORDER BY id`, consumer)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("list dead letters: %w", err)
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// replayTarget is what a replay names: one aggregate, one consumer.
type replayTarget struct {
	Consumer      string `json:"consumer"`
	AggregateType string `json:"aggregate_type"`
	AggregateID   string `json:"aggregate_id"`
}

// replay publishes one aggregate's retained events to one consumer's
// replay topic (package replay, as `outflow replay` does), through the
// configured broker.
func (c *Console) replay(w http.ResponseWriter, r *http.Request, s session) {
	t := replayTarget{Consumer: r.PostFormValue("consumer"), AggregateType: r.PostFormValue("aggregate_type"), AggregateID: r.PostFormValue("aggregate_id")}
	var cs *Consumer
	for i := range c.cfg.Consumers {
		if c.cfg.Consumers[i].Name == t.Consumer {
			cs = &c.cfg.Consumers[i]
		}
	}
	if cs == nil || t.AggregateType == "" || t.AggregateID == "" {
		http.Error(w, "replay needs a known consumer, an aggregate_type and an aggregate_id", http.StatusBadRequest)
		return
	}
	if c.cfg.Broker == nil {
		http.Error(w, "no broker configured: replay is not available", http.StatusServiceUnavailable)
		return
	}
	back := "/journey?q=" + url.QueryEscape(t.AggregateID)
	what := fmt.Sprintf("Replay every retained event of %s %s to %s (its replay topic): the consumer skips what it already handled.",
		t.AggregateType, t.AggregateID, t.Consumer)
	c.confirmThenDo(w, r, s, "replay", what, back, t, 0, true, func(ctx context.Context) (int64, error) {
		return replay.Publish(ctx, c.cfg.Pool, c.cfg.Broker, t.Consumer,
			replay.Filter{Topic: cs.Topic, AggregateType: t.AggregateType, AggregateIDs: []string{t.AggregateID}}, replay.Options{})
	})
}
