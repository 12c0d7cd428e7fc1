package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/forwarder"
	"github.com/outflow-dev/outflow/idempotency"
	"github.com/outflow-dev/outflow/internal/actionlog"
	"github.com/outflow-dev/outflow/replay"
)

// maxSelection bounds the ids one action names.
const maxSelection = 1000

// selection is what an action's form names: some ids, or every row
// matching the list's filter up to a bound. It holds only the filter of
// the action's list: the record of an action names what it applied to,
// never a field it ignored.
type selection struct {
	IDs []int64 `json:"ids,omitempty"`
	All bool    `json:"all,omitempty"`
	// Consumer and Status are the dead letters' filter.
	Consumer string `json:"consumer,omitempty"`
	Status   string `json:"status,omitempty"`
	// Topic is the parked rows' filter.
	Topic string `json:"topic,omitempty"`
	// Error filters either list by the exact error text.
	Error string `json:"error,omitempty"`
	// Through bounds "all": the newest row matching the filter when the
	// operator was asked (the list's page, or the confirmation); rows that
	// arrive after are not acted on.
	Through int64 `json:"through,omitempty"`
}

// list says which list an action comes from: the filter its form carries.
type list int

const (
	parkedList list = iota
	deadList
)

// noun is what a list holds, for the confirmations.
func (l list) noun() string {
	if l == parkedList {
		return "parked row"
	}
	return "dead letter"
}

func parseSelection(r *http.Request, from list) (selection, error) {
	sel := selection{All: r.PostFormValue("all") == "1", Error: r.PostFormValue("error")}
	switch from {
	case parkedList:
		sel.Topic = r.PostFormValue("topic")
	case deadList:
		sel.Consumer, sel.Status = r.PostFormValue("consumer"), r.PostFormValue("status")
		if sel.Status != "" && !slices.Contains(openStatuses, sel.Status) {
			return sel, errBadStatus
		}
		// Retry and discard act on dead letters only: the list under a
		// held or retrying filter shows none to act on, and "all" there
		// must not reach the dead ones it hides.
		if sel.All && sel.Status != "" && sel.Status != "dead" {
			return sel, fmt.Errorf("the filter shows %s dead letters: only dead ones can be retried or discarded", sel.Status)
		}
	}
	if v := r.PostFormValue("through"); v != "" && sel.All {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return sel, fmt.Errorf("through must be a row id, got %q", v)
		}
		sel.Through = n
	}
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

// target is what the record of an action on sel names: the filter and its
// bound and no ids for "all" (the ids ticked with it are ignored), the ids
// and no filter otherwise (chosen ids ignore the list's filter).
func (sel selection) target() selection {
	if sel.All {
		sel.IDs = nil
		return sel
	}
	return selection{IDs: sel.IDs}
}

// newest is the bound of "all" when the request carries none: the newest
// row the action would act on now.
func (c *Console) newest(ctx context.Context, from list, sel selection) (int64, error) {
	var q string
	var args pgx.NamedArgs
	if from == parkedList {
		q, args = qParkedMax, parkedFilter{Topic: sel.Topic, Error: sel.Error}.args(nil)
	} else {
		q, args = deadMaxQuery(sel.Consumer != "", sel.Error != ""), deadFilter{Consumer: sel.Consumer, Error: sel.Error}.args(nil)
	}
	var n int64
	if err := c.cfg.Pool.QueryRow(ctx, q, args).Scan(&n); err != nil {
		return 0, fmt.Errorf("read the newest row of the filter: %w", err)
	}
	return n, nil
}

// actIDs lists the rows an action on all of sel acts on, in tx: those
// matching its filter, up to its bound (of status dead, for dead
// letters).
func actIDs(ctx context.Context, tx pgx.Tx, from list, sel selection) ([]int64, error) {
	var q string
	var args pgx.NamedArgs
	if from == parkedList {
		q, args = qParkedActIDs, parkedFilter{Topic: sel.Topic, Error: sel.Error}.args(pgx.NamedArgs{"through": sel.Through})
	} else {
		q = deadActIDsQuery(sel.Consumer != "", sel.Error != "")
		args = deadFilter{Consumer: sel.Consumer, Error: sel.Error}.args(pgx.NamedArgs{"through": sel.Through})
	}
	rows, err := tx.Query(ctx, q, args)
	if err != nil {
		return nil, fmt.Errorf("list the rows of the filter: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("list the rows of the filter: %w", err)
	}
	return ids, nil
}

// question is the confirmation's question for verb on sel: the action,
// the count and the target ("Discard 3 dead letters of consumer
// sync-analytics?", "Retry all 1,234 dead letters matching
// consumer=sync-analytics, status=dead?").
func (c *Console) question(ctx context.Context, from list, verb string, sel selection) (string, error) {
	noun := from.noun()
	if sel.All {
		var q string
		var args pgx.NamedArgs
		var filter, unfiltered string
		if from == parkedList {
			q = parkedCountQuery("f.id <= @through")
			args = parkedFilter{Topic: sel.Topic, Error: sel.Error}.args(pgx.NamedArgs{"through": sel.Through})
			filter, unfiltered = describeFilter("topic", sel.Topic, "error", sel.Error), "of every topic"
		} else {
			q = deadCountQuery(sel.Consumer != "", sel.Error != "", []string{"dead"}, "id <= @through")
			args = deadFilter{Consumer: sel.Consumer, Error: sel.Error}.args(pgx.NamedArgs{"through": sel.Through})
			filter = describeFilter("consumer", sel.Consumer, "status", "dead", "error", sel.Error)
		}
		// Exact: the operator decides on this number, once.
		n, err := c.countRows(ctx, q, args, math.MaxInt32)
		if err != nil {
			return "", fmt.Errorf("count the rows of the filter: %w", err)
		}
		return allQuestion(verb, n, noun, filter, unfiltered), nil
	}
	q := `SELECT consumer, count(*) FROM dead_letters WHERE id = ANY($1) GROUP BY 1 ORDER BY 1`
	kind := "consumer"
	if from == parkedList {
		q, kind = `SELECT topic, count(*) FROM outbox WHERE id = ANY($1) GROUP BY 1 ORDER BY 1`, "topic"
	}
	rows, err := c.cfg.Pool.Query(ctx, q, sel.IDs)
	if err != nil {
		return "", fmt.Errorf("read the selected rows: %w", err)
	}
	groups, err := pgx.CollectRows(rows, pgx.RowToStructByPos[nameCount])
	if err != nil {
		return "", fmt.Errorf("read the selected rows: %w", err)
	}
	return verb + " " + plural(int64(len(sel.IDs)), noun, noun+"s") + targetOf(kind, groups) + "?", nil
}

// nameCount is a consumer or a topic and how many selected rows are its.
type nameCount struct {
	Name  string
	Count int64
}

// targetOf names the consumers or topics of the selected rows: " of
// consumer a", " of consumers a (2), b (1)".
func targetOf(kind string, groups []nameCount) string {
	switch len(groups) {
	case 0:
		return ""
	case 1:
		return " of " + kind + " " + groups[0].Name
	}
	parts := make([]string, len(groups))
	for i, g := range groups {
		parts[i] = fmt.Sprintf("%s (%s)", g.Name, thousands(g.Count))
	}
	return " of " + kind + "s " + strings.Join(parts, ", ")
}

// confirmData is the confirmation page: the same form again, with
// confirm=yes.
type confirmData struct {
	Action   string // the form's URL
	Question string // the action, the count and the target
	What     string // what the action does
	Back     string
	Fields   url.Values
	Selected int
	All      bool
	Through  int64
	// Danger marks a destructive action: its button looks it.
	Danger bool
	Button string
}

// act runs one action in two steps: without confirm=yes it shows what it
// would do, to how many rows of what, and asks; with it, it runs do in a
// transaction with its record in outflow_operator_actions (who, when, what, on
// what, how many), and returns to back(sel), the list it came from, with
// ?done=. An action on "all" acts on the rows matching the filter up to
// the bound the operator was shown (through=), or, when the request
// carries none, up to the newest row matching now.
func (c *Console) act(w http.ResponseWriter, r *http.Request, s session, from list, name, verb, what string, back func(selection) string,
	do func(ctx context.Context, tx pgx.Tx, sel selection) (int64, error),
) {
	sel, err := parseSelection(r, from)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if sel.All && sel.Through == 0 {
		if sel.Through, err = c.newest(r.Context(), from, sel); err != nil {
			c.fail(w, r, err)
			return
		}
	}
	cd := confirmData{What: what, Back: back(sel), Selected: len(sel.IDs), All: sel.All, Through: sel.Through,
		Danger: verb == "Discard", Button: verb}
	if r.PostFormValue("confirm") != "yes" {
		if cd.Question, err = c.question(r.Context(), from, verb, sel); err != nil {
			c.fail(w, r, err)
			return
		}
		cd.Button = strings.TrimSuffix(cd.Question, "?")
	}
	c.confirmThenDo(w, r, s, cd, func(ctx context.Context) (int64, error) {
		// A failed action is recorded with its error, which the page it
		// returns to shows.
		id, _, err := c.inTx(ctx, s, name, sel.target(), func(ctx context.Context, tx pgx.Tx) (int64, error) { return do(ctx, tx, sel) })
		return id, err
	})
}

// confirmThenDo asks for confirmation with cd (without confirm=yes), or
// runs run, which does the action, records it and returns the record's
// id, then returns to cd.Back with ?done=.
func (c *Console) confirmThenDo(w http.ResponseWriter, r *http.Request, s session, cd confirmData, run func(ctx context.Context) (int64, error)) {
	if r.PostFormValue("confirm") != "yes" {
		fields := url.Values{}
		for k, v := range r.PostForm {
			if k != CSRFField && k != "confirm" {
				fields[k] = v
			}
		}
		if cd.All && cd.Through != 0 {
			// The bound the question counted: what is confirmed.
			fields.Set("through", strconv.FormatInt(cd.Through, 10))
		}
		cd.Action, cd.Fields = r.URL.Path, fields
		p := c.pageFor(s, "Confirm")
		p.Data = cd
		c.render(w, http.StatusOK, "confirm", p)
		return
	}
	id, err := run(r.Context())
	if err != nil {
		c.fail(w, r, err)
		return
	}
	u, _ := url.Parse(cd.Back)
	q := u.Query()
	q.Set("done", strconv.FormatInt(id, 10))
	u.RawQuery = q.Encode()
	http.Redirect(w, r, u.String(), http.StatusSeeOther)
}

// inTx runs do and the insert of its record in outflow_operator_actions
// in one transaction (actionlog.Do), and returns the record's id and do's
// error: the change and its record commit together, or neither does. The
// statements run on ctx, the request's: a client that gives up before the
// commit cancels them, and the rollback undoes what was done. The commit
// does not take the client's cancellation: once it is sent, its outcome
// must not depend on the client's patience. A do that fails is rolled back
// and recorded alone, with its error and no rows. A FrameworkOnly
// console records in the same table (the framework's), and the log line
// is written in either mode.
func (c *Console) inTx(ctx context.Context, s session, name string, target any,
	do func(ctx context.Context, tx pgx.Tx) (int64, error),
) (id int64, doErr error, err error) {
	e := actionlog.Entry{Actor: actorOf(s), Action: name, Target: target}
	id, doErr, err = actionlog.Do(ctx, c.cfg.Pool, e, func(ctx context.Context, tx pgx.Tx) (int64, error) {
		n, err := do(ctx, tx)
		e.Count = n // for the log line
		return n, err
	})
	if err != nil {
		return 0, doErr, fmt.Errorf("console action %s: %w", name, err)
	}
	if doErr != nil {
		e.Count = 0 // rolled back
	}
	c.logAction(e, doErr)
	return id, doErr, nil
}

// actorOf is who a session's actions are recorded as: its API key, or a
// FrameworkOnly console's operator key.
func actorOf(s session) actionlog.Actor {
	return actionlog.Actor{Kind: actionlog.Console, ID: s.keyID, Name: s.keyName}
}

// logAction writes the log line of an action, the record's copy for log
// pipelines.
func (c *Console) logAction(e actionlog.Entry, doErr error) {
	target, _ := json.Marshal(e.Target) // encoded already by the record
	attrs := []any{"action", e.Action, "api_key_id", e.Actor.ID, "target", string(target), "rows", e.Count}
	if doErr != nil {
		attrs = append(attrs, "error", doErr.Error())
	}
	c.log.Info("console: action", attrs...)
}

// record records an action done outside a transaction (a replay, which
// publishes to a broker) with its outcome, n rows or doErr, and returns
// the record's id.
func (c *Console) record(ctx context.Context, s session, e actionlog.Entry, n int64, doErr error) (int64, error) {
	e.Actor, e.Count = actorOf(s), n
	if doErr != nil {
		e.Error = doErr.Error()
	}
	id, err := actionlog.Insert(ctx, c.cfg.Pool, e)
	if err != nil {
		return 0, fmt.Errorf("console action %s: %w", e.Action, err)
	}
	c.logAction(e, doErr)
	return id, nil
}

func parkedBack(sel selection) string {
	q := url.Values{}
	if sel.Topic != "" {
		q.Set("topic", sel.Topic)
	}
	if sel.Error != "" {
		q.Set("error", sel.Error)
	}
	if len(q) == 0 {
		return "/parked"
	}
	return "/parked?" + q.Encode()
}

func (c *Console) parkedRetry(w http.ResponseWriter, r *http.Request, s session) {
	c.act(w, r, s, parkedList, "outbox.retry", "Retry", "Retry parked outbox rows: they go back in line with a fresh count of attempts.", parkedBack,
		func(ctx context.Context, tx pgx.Tx, sel selection) (int64, error) {
			return releaseParked(ctx, tx, sel, forwarder.RetryParked)
		})
}

// discardWhat is the discard's confirmation, and the template's: what a
// discard does, for the operator deciding.
const discardWhat = "Discard parked outbox rows: each event is replaced by a discard marker, which the forwarder publishes " +
	"in its place. Consumers receive the marker, not the event: their handler is not run for it, and the aggregate's later " +
	"events flow after it. The row is kept, marked discarded."

func (c *Console) parkedDiscard(w http.ResponseWriter, r *http.Request, s session) {
	c.act(w, r, s, parkedList, "outbox.discard", "Discard", discardWhat, parkedBack,
		func(ctx context.Context, tx pgx.Tx, sel selection) (int64, error) {
			return releaseParked(ctx, tx, sel, forwarder.DiscardParked)
		})
}

// releaseParked applies release (retry or discard) to the selected rows,
// or to every parked row of the selection's filter up to its bound.
func releaseParked(ctx context.Context, tx pgx.Tx, sel selection,
	release func(context.Context, forwarder.Querier, forwarder.ParkedFilter) (int64, error),
) (int64, error) {
	ids := sel.IDs
	if sel.All {
		var err error
		if ids, err = actIDs(ctx, tx, parkedList, sel); err != nil {
			return 0, err
		}
	}
	var total int64
	for _, id := range ids {
		n, err := release(ctx, tx, forwarder.ParkedFilter{ID: id})
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
	if sel.Error != "" {
		q.Set("error", sel.Error)
	}
	if len(q) == 0 {
		return "/dead"
	}
	return "/dead?" + q.Encode()
}

func (c *Console) deadRetry(w http.ResponseWriter, r *http.Request, s session) {
	c.act(w, r, s, deadList, "dlq.retry", "Retry", "Retry dead letters: the consumer tries them again at once.", deadBack,
		func(ctx context.Context, tx pgx.Tx, sel selection) (int64, error) {
			// With all, the status filter is "" or dead (parseSelection):
			// what the list shows that can be retried is every dead letter
			// of the filter, up to its bound.
			ids := sel.IDs
			if sel.All {
				var err error
				if ids, err = actIDs(ctx, tx, deadList, sel); err != nil {
					return 0, err
				}
			}
			var total int64
			for _, id := range ids {
				n, err := idempotency.RetryDeadLetter(ctx, tx, "", id)
				total += n
				if err != nil && !errors.Is(err, idempotency.ErrNotDead) {
					return total, err
				}
			}
			return total, nil
		})
}

func (c *Console) deadDiscard(w http.ResponseWriter, r *http.Request, s session) {
	c.act(w, r, s, deadList, "dlq.discard", "Discard", "Discard dead letters: recorded as handled without running the handler; the events held behind them are released.", deadBack,
		func(ctx context.Context, tx pgx.Tx, sel selection) (int64, error) {
			ids := sel.IDs
			if sel.All { // as for a retry: every dead letter of the filter, up to its bound
				var err error
				if ids, err = actIDs(ctx, tx, deadList, sel); err != nil {
					return 0, err
				}
			}
			var n int64
			for _, id := range ids {
				// In a savepoint of tx: one that is no longer dead leaves
				// tx usable.
				err := idempotency.DiscardDeadLetter(ctx, tx, id)
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

// replayTarget is what a replay names: one aggregate, one consumer.
type replayTarget struct {
	Consumer      string `json:"consumer"`
	AggregateType string `json:"aggregate_type"`
	AggregateID   string `json:"aggregate_id"`
}

// filter is what a replay of t to a consumer of topic sends: the journey's
// choices count by it, and the replay publishes it.
func (t replayTarget) filter(topic string) replay.Filter {
	return replay.Filter{Topic: topic, AggregateType: t.AggregateType, AggregateIDs: []string{t.AggregateID}}
}

// replayQuestion is the confirmation of a replay: what, how many, to whom.
func replayQuestion(n int64, aggType, aggID, consumer string) string {
	return fmt.Sprintf("Replay %s of %s %s to consumer %s?", plural(n, "event", "events"), aggType, aggID, consumer)
}

// replayChoice is a consumer a journey's aggregate can be replayed to, and
// how many of its events that replay sends (those of the consumer's topic).
type replayChoice struct {
	Consumer string
	Events   int64
	// Question is the replay's confirmation, which console.js asks when
	// the choice is made.
	Question string
}

// replayChoices are the configured consumers, each with the count of what
// a replay of the aggregate to it would send (replay.Count: the filter the
// replay publishes, read through the aggregate's index).
func (c *Console) replayChoices(ctx context.Context, aggType, aggID string) ([]replayChoice, error) {
	t := replayTarget{AggregateType: aggType, AggregateID: aggID}
	byTopic := map[string]int64{}
	var out []replayChoice
	for _, cs := range c.cfg.Consumers {
		n, ok := byTopic[cs.Topic]
		if !ok {
			var err error
			if n, err = replay.Count(ctx, c.cfg.Pool, t.filter(cs.Topic)); err != nil {
				return nil, fmt.Errorf("journey: count a replay's events: %w", err)
			}
			byTopic[cs.Topic] = n
		}
		out = append(out, replayChoice{Consumer: cs.Name, Events: n, Question: replayQuestion(n, aggType, aggID, cs.Name)})
	}
	return out, nil
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
	n, err := replay.Count(r.Context(), c.cfg.Pool, t.filter(cs.Topic))
	if err != nil {
		c.fail(w, r, fmt.Errorf("count the replay's events: %w", err))
		return
	}
	what := fmt.Sprintf("Replay every retained event of %s %s on topic %s to %s (its replay topic): the consumer skips what it already handled.",
		t.AggregateType, t.AggregateID, cs.Topic, t.Consumer)
	cd := confirmData{What: what, Back: back, All: true, Button: "Replay to " + t.Consumer,
		Question: replayQuestion(n, t.AggregateType, t.AggregateID, t.Consumer)}
	c.confirmThenDo(w, r, s, cd, func(ctx context.Context) (int64, error) {
		return c.replayRecorded(ctx, s, t, cs.Topic)
	})
}

// replayTimeout bounds a replay, which runs to its end whatever the client
// does.
const replayTimeout = 5 * time.Minute

// replayRecorded publishes t's replay and records it. What goes to the
// broker cannot be part of a database transaction: the replay does not
// take the client's cancellation, so that once it starts it is recorded
// with what it published, failed or not (a replay is safe to repeat: the
// consumer skips what it already handled).
func (c *Console) replayRecorded(ctx context.Context, s session, t replayTarget, topic string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), replayTimeout)
	defer cancel()
	n, doErr := replay.Publish(ctx, c.cfg.Pool, c.cfg.Broker, t.Consumer, t.filter(topic), replay.Options{})
	rctx, rcancel := actionlog.Detach(ctx)
	defer rcancel()
	// Named by its aggregate too: the aggregate's journey lists its replays.
	return c.record(rctx, s, actionlog.Entry{Action: "replay", Target: t, AggregateType: t.AggregateType, AggregateID: t.AggregateID}, n, doErr)
}
