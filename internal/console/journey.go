package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// maxJourneyEvents bounds one journey: an aggregate's events, oldest first.
const maxJourneyEvents = 1000

// The journey's queries; each goes through an index (TestQueriesUseIndexes).
const (
	qFindMessage = `SELECT aggregate_type, aggregate_id FROM outbox WHERE message_id = $1`
	// Published rows through outbox_aggregate_idx, pending ones through
	// outbox_pending_idx: their partial predicates are the two branches'.
	qEvents = `
		SELECT id, message_id::text, topic, event_type, aggregate_version, payload::text, metadata::text,
		       attempts, coalesce(last_error, ''), created_at, published_at, parked_at, discarded_at
		FROM (
			SELECT * FROM outbox WHERE aggregate_type = $1 AND aggregate_id = $2 AND published_at IS NOT NULL
			UNION ALL
			SELECT * FROM outbox WHERE aggregate_type = $1 AND aggregate_id = $2 AND published_at IS NULL
		) o ORDER BY aggregate_version, id LIMIT $3`
	qProcessed = `
		SELECT message_id::text, consumer, processed_at FROM processed_messages WHERE message_id = ANY($1::uuid[])`
	qDeadOutcomes = `
		SELECT id, message_id::text, consumer, status, reason, error, attempts, resolved_at FROM dead_letters
		WHERE consumer = ANY($1) AND message_id = ANY($2::uuid[])`
	qDeliveries = `
		SELECT d.id, d.message_id::text, d.url, d.status, a.attempted_at, a.status_code, a.latency_ms, coalesce(a.error, '')
		FROM webhook_deliveries d LEFT JOIN webhook_attempts a ON a.delivery_id = d.id
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
	Attempts         int
	LastError        string
	CreatedAt        time.Time
	PublishedAt      *time.Time
	ParkedAt         *time.Time
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
}

type delivery struct {
	ID       int64
	URL      string
	Status   string
	Attempts []attempt
}

type attempt struct {
	At         time.Time
	StatusCode *int
	LatencyMS  float64
	Error      string
}

type journey struct {
	Query                      string
	AggregateType, AggregateID string
	Events                     []journeyEvent
	Truncated                  bool
	// Consumers a replay can go to; empty when no broker is configured.
	ReplayTo []string
}

func (c *Console) journeyPage(w http.ResponseWriter, r *http.Request, s session) {
	p := c.pageFor(s, "Journey")
	q := strings.TrimSpace(r.URL.Query().Get("q"))
	j := journey{Query: q}
	var err error
	if q != "" {
		if j, err = c.readJourney(r.Context(), q); err != nil {
			c.fail(w, r, err)
			return
		}
	}
	if c.cfg.Broker != nil && len(j.Events) > 0 {
		for _, cs := range c.cfg.Consumers {
			j.ReplayTo = append(j.ReplayTo, cs.Name)
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
// of Config.AggregateType) and reads every event of it. Each query goes
// through an index: the outbox's message_id, outbox_aggregate_idx
// (published rows), outbox_pending_idx (pending ones), the primary keys of
// processed_messages and dead_letters' (consumer, message_id), and
// webhook_deliveries' message_id.
func (c *Console) readJourney(ctx context.Context, q string) (journey, error) {
	j := journey{Query: q, AggregateType: c.cfg.AggregateType, AggregateID: q}
	pool := c.cfg.Pool
	if id, err := uuid.Parse(q); err == nil {
		err := pool.QueryRow(ctx, qFindMessage, id).
			Scan(&j.AggregateType, &j.AggregateID)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return j, fmt.Errorf("journey: find message: %w", err)
		}
	}
	rows, err := pool.Query(ctx, qEvents, j.AggregateType, j.AggregateID, maxJourneyEvents+1)
	if err != nil {
		return j, fmt.Errorf("journey: read events: %w", err)
	}
	j.Events, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (journeyEvent, error) {
		var e journeyEvent
		err := r.Scan(&e.ID, &e.MessageID, &e.Topic, &e.EventType, &e.AggregateVersion, &e.Payload, &e.Metadata,
			&e.Attempts, &e.LastError, &e.CreatedAt, &e.PublishedAt, &e.ParkedAt, &e.DiscardedAt)
		return e, err
	})
	if err != nil {
		return j, fmt.Errorf("journey: read events: %w", err)
	}
	if len(j.Events) > maxJourneyEvents {
		j.Events, j.Truncated = j.Events[:maxJourneyEvents], true
	}
	if len(j.Events) == 0 {
		return j, nil
	}
	ids := make([]string, len(j.Events))
	byID := map[string]*journeyEvent{}
	for i := range j.Events {
		ids[i] = j.Events[i].MessageID
		byID[ids[i]] = &j.Events[i]
	}
	if err := c.readOutcomes(ctx, ids, byID); err != nil {
		return j, err
	}
	if err := c.readDeliveries(ctx, ids, byID); err != nil {
		return j, err
	}
	return j, nil
}

func (c *Console) readOutcomes(ctx context.Context, ids []string, byID map[string]*journeyEvent) error {
	names := make([]string, len(c.cfg.Consumers))
	for i, cs := range c.cfg.Consumers {
		names[i] = cs.Name
	}
	processed := map[[2]string]time.Time{}
	rows, err := c.cfg.Pool.Query(ctx, qProcessed, ids)
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
	for _, id := range ids {
		e := byID[id]
		for _, name := range names {
			k := [2]string{id, name}
			// A parked message has its processed_messages row too (it was
			// taken in, into dead_letters): its outcome is the dead
			// letter's, applied at resolved_at when resolved.
			o, ok := dead[k]
			switch {
			case ok && o.Status == "resolved":
				o.Status = "processed"
			case ok:
			default:
				o = outcome{Consumer: name}
				if at, ok := processed[k]; ok {
					o.ProcessedAt, o.Status = &at, "processed"
				}
			}
			e.Outcomes = append(e.Outcomes, o)
		}
	}
	return nil
}

func (c *Console) readDeliveries(ctx context.Context, ids []string, byID map[string]*journeyEvent) error {
	rows, err := c.cfg.Pool.Query(ctx, qDeliveries, ids)
	if err != nil {
		return fmt.Errorf("journey: read webhook deliveries: %w", err)
	}
	var (
		id        int64
		mid, url  string
		status    string
		at        *time.Time
		code      *int
		latency   *float64
		errText   string
		lastDelID int64
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &mid, &url, &status, &at, &code, &latency, &errText}, func() error {
		e := byID[mid]
		if id != lastDelID {
			e.Deliveries = append(e.Deliveries, delivery{ID: id, URL: url, Status: status})
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
