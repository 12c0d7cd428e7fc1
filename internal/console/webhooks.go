package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The webhooks list: the deliveries that need a look, failing (pending
// after a failed attempt) and dead (given up), each with its last error
// and a link to its event's journey.

// webhookStatuses are the list's filters: a delivery's state as the
// overview counts it.
var webhookStatuses = []string{"failing", "dead"}

var errBadWebhookStatus = fmt.Errorf("status must be empty or one of %s", strings.Join(webhookStatuses, ", "))

// webhookListQuery is the list's query for a filter: one branch per
// status, merged in id order. The dead are an ordered scan of
// webhook_deliveries_dead_idx (id) that stops after @limit rows. The
// failing have no index in id order: the branch reads the pending
// deliveries through their partial index (webhook_deliveries_due_idx, as
// the overview's count of them does) and keeps the first @limit by id; the
// OFFSET 0 keeps the planner from walking the primary key instead, which
// reads every delivery, delivered ones included, before the first failing
// one. Arguments: @after, @limit.
func webhookListQuery(statuses []string) string {
	const cols = `id, message_id::text, merchant_id::text, url, event_type, %s AS status, attempts, coalesce(last_error, ''),
		       %s AS next_attempt_at, created_at`
	branches := make([]string, len(statuses))
	for i, st := range statuses {
		switch st {
		case "failing":
			branches[i] = `(SELECT * FROM (SELECT ` + fmt.Sprintf(cols, "'failing'", "next_attempt_at") + `
		FROM webhook_deliveries WHERE status = 'pending' AND attempts > 0 AND id > @after OFFSET 0) f ORDER BY id LIMIT @limit)`
		case "dead":
			branches[i] = `(SELECT ` + fmt.Sprintf(cols, "'dead'", "NULL::timestamptz") + `
		FROM webhook_deliveries WHERE status = 'dead' AND id > @after ORDER BY id LIMIT @limit)`
		}
	}
	if len(branches) == 1 {
		return branches[0]
	}
	return `SELECT * FROM (` + strings.Join(branches, "\n\t\tUNION ALL ") + `) d ORDER BY id LIMIT @limit`
}

type webhookRow struct {
	ID                         int64
	MessageID, MerchantID, URL string
	EventType, Status          string
	Attempts                   int32
	LastError                  string
	NextAttemptAt              *time.Time
	CreatedAt                  time.Time
}

type webhookList struct {
	Rows         []webhookRow
	Status       string
	After, Next  int64 // this page's after= and the next one's (0: this is the last)
	NotInstalled bool  // FrameworkOnly: the app's tables are not in this database
}

func (c *Console) readWebhooks(ctx context.Context, status string, after int64) (webhookList, error) {
	wl := webhookList{Status: status, After: after}
	statuses := webhookStatuses
	if status != "" {
		found := false
		for _, s := range webhookStatuses {
			found = found || s == status
		}
		if !found {
			return wl, errBadWebhookStatus
		}
		statuses = []string{status}
	}
	rows, err := c.cfg.Pool.Query(ctx, webhookListQuery(statuses), pgx.NamedArgs{"after": after, "limit": c.cfg.PageSize + 1})
	if err != nil {
		return wl, fmt.Errorf("list webhook deliveries: %w", err)
	}
	if wl.Rows, err = pgx.CollectRows(rows, pgx.RowToStructByPos[webhookRow]); err != nil {
		return wl, fmt.Errorf("list webhook deliveries: %w", err)
	}
	if len(wl.Rows) > c.cfg.PageSize {
		wl.Rows = wl.Rows[:c.cfg.PageSize]
		wl.Next = wl.Rows[len(wl.Rows)-1].ID
	}
	return wl, nil
}

func (c *Console) webhooksPage(w http.ResponseWriter, r *http.Request, s session) {
	p := c.pageFor(s, "Webhook deliveries")
	if c.cfg.FrameworkOnly {
		p.Data = webhookList{NotInstalled: true}
		c.render(w, http.StatusOK, "webhooks", p)
		return
	}
	wl, err := c.readWebhooks(r.Context(), r.URL.Query().Get("status"), afterParam(r, "after"))
	if errors.Is(err, errBadWebhookStatus) {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	p.Data = wl
	c.render(w, http.StatusOK, "webhooks", p)
}
