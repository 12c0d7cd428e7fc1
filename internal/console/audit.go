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
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/internal/actionlog"
)

// The audit of operators' actions (package actionlog): the Actions page,
// the result shown on the page an action returns to, and an aggregate's
// replays on its journey. The console's actions and the outflow tool's are
// in the same table, the framework's, in both modes.

// action is a recorded action as the page an action returns to shows it
// (page.Result).
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

// doneAction is the action named by ?done=, shown on the page an action
// returns to.
func (c *Console) doneAction(r *http.Request) (*action, error) {
	id := afterParam(r, "done")
	if id == 0 {
		return nil, nil
	}
	rec, ok, err := actionlog.Get(r.Context(), c.cfg.Pool, id)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, nil // a stale or made-up id shows nothing
	}
	return &action{ID: rec.ID, KeyID: rec.Actor.ID, KeyName: rec.Actor.Name, At: rec.At, Action: rec.Action,
		Target: string(rec.Target), ResultCount: rec.Count, Error: rec.Error}, nil
}

// auditLink is a link the audit shows: a target, a consumer, an aggregate.
type auditLink struct {
	Text, Href string
}

// auditRow is one recorded action on the Actions page.
type auditRow struct {
	ID      int64
	At      time.Time
	Kind    string // console or cli
	Who     string // the API key's name, "operator", or user@host
	WhoID   string // the API key's id; "" for the tool
	Command string // the tool's command line
	Action  string
	// What is what the action chose, in words ("ids", "every dead letter
	// of ..."), and On its links.
	What   string
	On     []auditLink
	More   int // ids not shown
	Target string
	Count  int64
	Error  string
}

// auditPage is the Actions page.
type auditPage struct {
	Rows  []auditRow
	Total int64
	// The filter, and the choices it is made from.
	Kind, Action string
	Kinds        []actionlog.Kind
	Actions      []string
	// The pager's links, keeping the filter; "" for none.
	FirstHref, NewerHref, OlderHref string
}

// auditIDsShown bounds the ids of one action that the page links, each to
// its journey.
const auditIDsShown = 20

// errBadFilter is an Actions page filter naming nothing that exists.
var errBadFilter = errors.New("bad filter")

func (c *Console) actionsPage(w http.ResponseWriter, r *http.Request, s session) {
	q := r.URL.Query()
	ap := auditPage{Kind: q.Get("kind"), Action: q.Get("action"), Kinds: actionlog.Kinds}
	pg := actionlog.Page{Before: afterParam(r, "before"), After: afterParam(r, "after"), Limit: c.cfg.PageSize}
	if pg.Before != 0 && pg.After != 0 {
		http.Error(w, "before and after: give one at most", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	var err error
	if ap.Actions, err = actionlog.Actions(ctx, c.cfg.Pool); err != nil {
		c.fail(w, r, err)
		return
	}
	if ap.Kind != "" && !slices.Contains(actionlog.Kinds, actionlog.Kind(ap.Kind)) {
		http.Error(w, fmt.Sprintf("%v: kind must be empty, %s or %s", errBadFilter, actionlog.Console, actionlog.CLI), http.StatusBadRequest)
		return
	}
	if ap.Action != "" && !slices.Contains(ap.Actions, ap.Action) {
		http.Error(w, fmt.Sprintf("%v: action %q: no such action recorded (recorded: %s)", errBadFilter, ap.Action,
			strings.Join(ap.Actions, ", ")), http.StatusBadRequest)
		return
	}
	f := actionlog.Filter{Kind: actionlog.Kind(ap.Kind), Action: ap.Action}
	href := func(key string, id int64) string {
		q := url.Values{}
		if ap.Kind != "" {
			q.Set("kind", ap.Kind)
		}
		if ap.Action != "" {
			q.Set("action", ap.Action)
		}
		if key != "" {
			q.Set(key, strconv.FormatInt(id, 10))
		}
		if len(q) == 0 {
			return "/actions"
		}
		return "/actions?" + q.Encode()
	}
	l, err := actionlog.List(ctx, c.cfg.Pool, f, pg)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if ap.Total, err = actionlog.Count(ctx, c.cfg.Pool, f); err != nil {
		c.fail(w, r, err)
		return
	}
	if l.Older && len(l.Records) > 0 {
		ap.OlderHref = href("before", l.Records[len(l.Records)-1].ID)
	}
	if l.Newer && len(l.Records) > 0 {
		ap.NewerHref = href("after", l.Records[0].ID)
	}
	if l.Newer || (len(l.Records) == 0 && (pg.Before != 0 || pg.After != 0)) {
		ap.FirstHref = href("", 0)
	}
	if ap.Rows, err = c.auditRows(ctx, l.Records); err != nil {
		c.fail(w, r, err)
		return
	}
	p := c.pageFor(s, "Actions")
	p.Data = ap
	c.render(w, http.StatusOK, "actions", p)
}

// auditTarget is what the console and the tool record as an action's
// target: the fields of each action's, all optional.
type auditTarget struct {
	IDs           []int64  `json:"ids"`
	All           bool     `json:"all"`
	Consumer      string   `json:"consumer"`
	Status        string   `json:"status"`
	Topic         string   `json:"topic"`
	AggregateType string   `json:"aggregate_type"`
	AggregateID   string   `json:"aggregate_id"`
	AggregateIDs  []string `json:"aggregate_ids"`
	AllAggregates bool     `json:"all_aggregates"`
	MoreIDs       int      `json:"more_ids"` // ids the tool left out of the record
	// A webhook endpoint action's.
	AccountID  string `json:"account_id"`
	EndpointID string `json:"endpoint_id"`
	MessageID  string `json:"message_id"`
}

// targetRows says which table an action's ids are rows of: dead letters
// for dlq.*, outbox rows for outbox.*.
func targetRows(action string) string {
	switch {
	case strings.HasPrefix(action, "dlq."):
		return "dead_letters"
	case strings.HasPrefix(action, "outbox.") && action != "outbox.repartition":
		return "outbox"
	}
	return ""
}

// auditRows makes the page's rows, each target a link: a dead letter or a
// parked row to its message's journey (its message id read by primary
// key, when the row is still kept), a consumer to its dead letters, an
// aggregate to its journey.
func (c *Console) auditRows(ctx context.Context, recs []actionlog.Record) ([]auditRow, error) {
	targets := make([]auditTarget, len(recs))
	wanted := map[string][]int64{}
	for i, rec := range recs {
		_ = json.Unmarshal(rec.Target, &targets[i]) // a target of another shape shows as its JSON only
		if table := targetRows(rec.Action); table != "" {
			ids := targets[i].IDs[:min(len(targets[i].IDs), auditIDsShown)]
			wanted[table] = append(wanted[table], ids...)
		}
	}
	messages := map[string]map[int64]string{}
	for table, ids := range wanted {
		m, err := c.messageIDs(ctx, table, ids)
		if err != nil {
			return nil, err
		}
		messages[table] = m
	}
	rows := make([]auditRow, len(recs))
	for i, rec := range recs {
		t := targets[i]
		row := auditRow{ID: rec.ID, At: rec.At, Kind: string(rec.Actor.Kind), Who: rec.Actor.Name, WhoID: rec.Actor.ID,
			Command: rec.Actor.Command, Action: rec.Action, Target: string(rec.Target), Count: rec.Count, Error: rec.Error}
		if rec.Actor.Kind == actionlog.CLI {
			row.Who, row.WhoID = rec.Actor.ID, "" // user@host
		}
		table := targetRows(rec.Action)
		switch {
		case t.All && table == "dead_letters":
			row.What = "every dead letter (status dead)"
		case t.All && table == "outbox":
			row.What = "every parked row"
		case t.AllAggregates:
			row.What = "every aggregate of type " + t.AggregateType
		}
		if table != "" {
			noun := "dead letter #"
			if table == "outbox" {
				noun = "row #"
			}
			for i, id := range t.IDs[:min(len(t.IDs), auditIDsShown)] {
				l := auditLink{Text: "#" + strconv.FormatInt(id, 10)}
				if i == 0 {
					l.Text = noun + strconv.FormatInt(id, 10)
				}
				if mid, ok := messages[table][id]; ok {
					l.Href = "/journey?q=" + url.QueryEscape(mid)
				}
				row.On = append(row.On, l)
			}
			row.More = max(0, len(t.IDs)-auditIDsShown)
		}
		if t.Consumer != "" {
			row.On = append(row.On, auditLink{Text: "consumer " + t.Consumer, Href: "/dead?" + url.Values{"consumer": {t.Consumer}}.Encode()})
		}
		if t.Topic != "" {
			row.On = append(row.On, auditLink{Text: "topic " + t.Topic, Href: "/parked?" + url.Values{"topic": {t.Topic}}.Encode()})
		}
		if t.AggregateID != "" {
			row.On = append(row.On, auditLink{Text: t.AggregateType + " " + t.AggregateID, Href: c.journeyHref(t.AggregateType, t.AggregateID)})
		}
		for _, id := range t.AggregateIDs[:min(len(t.AggregateIDs), auditIDsShown)] {
			row.On = append(row.On, auditLink{Text: t.AggregateType + " " + id, Href: c.journeyHref(t.AggregateType, id)})
		}
		if t.EndpointID != "" {
			row.On = append(row.On, auditLink{Text: "endpoint " + t.EndpointID + " of account " + t.AccountID,
				Href: "/webhooks/endpoints/" + url.PathEscape(t.EndpointID)})
		}
		if t.MessageID != "" {
			row.On = append(row.On, auditLink{Text: "message " + t.MessageID,
				Href: "/webhooks/endpoints/" + url.PathEscape(t.EndpointID) + "?" + url.Values{"message": {t.MessageID}}.Encode()})
		}
		row.More += max(0, len(t.AggregateIDs)-auditIDsShown) + t.MoreIDs
		rows[i] = row
	}
	return rows, nil
}

// messageIDs reads the message ids of rows of table (dead_letters or
// outbox) by primary key; a row no longer kept has none.
func (c *Console) messageIDs(ctx context.Context, table string, ids []int64) (map[int64]string, error) {
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	ids = slices.Compact(ids)
	rows, err := c.cfg.Pool.Query(ctx, `SELECT id, message_id::text FROM `+pgx.Identifier{table}.Sanitize()+` WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("read the message ids of the actions' %s: %w", table, err)
	}
	out := map[int64]string{}
	var (
		id  int64
		mid string
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &mid}, func() error { out[id] = mid; return nil }); err != nil {
		return nil, fmt.Errorf("read the message ids of the actions' %s: %w", table, err)
	}
	return out, nil
}

// journeyHref links an aggregate's journey: by its id, which the journey
// reads as one of Config.AggregateType; an aggregate of another type by
// its type and id, from the newest event.
func (c *Console) journeyHref(aggType, aggID string) string {
	if aggType == c.cfg.AggregateType {
		return "/journey?" + url.Values{"q": {aggID}}.Encode()
	}
	newest := position{math.MaxInt64, math.MaxInt64}
	return "/journey?" + url.Values{"q": {aggID}, "aggregate_type": {aggType}, "aggregate_id": {aggID}, "before": {newest.String()}}.Encode()
}

// journeyReplays bounds the replays a journey shows: the newest.
const journeyReplays = 10

// replays are an aggregate's newest replays, on its journey.
type replays struct {
	Rows []replayRow
	More bool // older ones are on the Actions page
}

// replayRow is one replay of the aggregate.
type replayRow struct {
	ID         int64
	ActionHref string // the Actions page from this record on
	At         time.Time
	Kind       string
	Who        string
	Consumer   string
	Count      int64
	Error      string
}

// readReplays reads the newest replays of an aggregate from the audit,
// through outflow_operator_actions_aggregate_idx.
func (c *Console) readReplays(ctx context.Context, aggType, aggID string) (replays, error) {
	recs, err := actionlog.OnAggregate(ctx, c.cfg.Pool, aggType, aggID, "replay", journeyReplays+1)
	if err != nil {
		return replays{}, fmt.Errorf("journey: %w", err)
	}
	more := len(recs) > journeyReplays
	recs = recs[:min(len(recs), journeyReplays)]
	out := make([]replayRow, len(recs))
	for i, rec := range recs {
		var t auditTarget
		_ = json.Unmarshal(rec.Target, &t)
		who := rec.Actor.Name
		if rec.Actor.Kind == actionlog.CLI {
			who = rec.Actor.ID
		}
		out[i] = replayRow{ID: rec.ID, ActionHref: "/actions?before=" + strconv.FormatInt(rec.ID+1, 10), At: rec.At, Kind: string(rec.Actor.Kind), Who: who, Consumer: t.Consumer,
			Count: rec.Count, Error: rec.Error}
	}
	return replays{Rows: out, More: more}, nil
}
