package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
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

// webhookCond is the condition of a status's deliveries: the failing are
// the pending ones after a failed attempt (webhook_deliveries_due_idx, as
// the overview's count of them reads), the dead those given up
// (webhook_deliveries_dead_idx).
func webhookCond(status string) string {
	if status == "failing" {
		return "status = 'pending' AND attempts > 0"
	}
	return "status = 'dead'"
}

// webhookListQuery is the list's query for a filter: one branch per
// status, merged in id order, a page after @after or, with before, before
// @before (newest first: fillPage turns it). The dead are an ordered scan
// of webhook_deliveries_dead_idx that stops after @limit rows. The failing
// have no index in id order: the branch reads the pending deliveries
// through their partial index and keeps the first @limit by id; the
// OFFSET 0 keeps the planner from walking the primary key instead, which
// reads every delivery, delivered ones included, before the first failing
// one. Arguments: @after or @before, @limit.
func webhookListQuery(statuses []string, before bool) string {
	const cols = `id, message_id::text, merchant_id::text, url, event_type, %s AS status, attempts, coalesce(last_error, ''),
		       %s AS next_attempt_at, created_at`
	pos, order := "id > @after", "id"
	if before {
		pos, order = "id < @before", "id DESC"
	}
	branches := make([]string, len(statuses))
	for i, st := range statuses {
		switch st {
		case "failing":
			branches[i] = `(SELECT * FROM (SELECT ` + fmt.Sprintf(cols, "'failing'", "next_attempt_at") + `
		FROM webhook_deliveries WHERE ` + webhookCond(st) + ` AND ` + pos + ` OFFSET 0) f ORDER BY ` + order + ` LIMIT @limit)`
		case "dead":
			branches[i] = `(SELECT ` + fmt.Sprintf(cols, "'dead'", "NULL::timestamptz") + `
		FROM webhook_deliveries WHERE ` + webhookCond(st) + ` AND ` + pos + ` ORDER BY ` + order + ` LIMIT @limit)`
		}
	}
	if len(branches) == 1 {
		return branches[0]
	}
	return `SELECT * FROM (` + strings.Join(branches, "\n\t\tUNION ALL ") + `) d ORDER BY ` + order + ` LIMIT @limit`
}

// webhookCountQuery counts a filter's deliveries (those before @first
// with rank), up to @cap: each status's through its own partial index.
func webhookCountQuery(statuses []string, rank bool) string {
	branches := make([]string, len(statuses))
	for i, st := range statuses {
		cond := webhookCond(st)
		if rank {
			cond += " AND id < @first"
		}
		branches[i] = `(SELECT 1 FROM webhook_deliveries WHERE ` + cond + ` LIMIT @cap)`
	}
	return `SELECT count(*) FROM (` + strings.Join(branches, " UNION ALL ") + `) c`
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
	Pager        pager
	At           int64 // the row a link asked for (at=), marked
	NotInstalled bool  // FrameworkOnly: the app's tables are not in this database
}

// readWebhooks reads a page of the list at k, with its pager: First,
// Previous and Next, and "Showing 51–100 of 1,234" (counts capped at
// countCap), as the other lists page.
func (c *Console) readWebhooks(ctx context.Context, status string, k keyset) (webhookList, error) {
	wl := webhookList{Status: status, At: k.at}
	statuses := webhookStatuses
	if status != "" {
		if !slices.Contains(webhookStatuses, status) {
			return wl, errBadWebhookStatus
		}
		statuses = []string{status}
	}
	n := c.cfg.PageSize
	rows, err := c.cfg.Pool.Query(ctx, webhookListQuery(statuses, k.before != 0),
		pgx.NamedArgs{"after": k.after, "before": k.before, "limit": n + 1})
	if err != nil {
		return wl, fmt.Errorf("list webhook deliveries: %w", err)
	}
	read, err := pgx.CollectRows(rows, pgx.RowToStructByPos[webhookRow])
	if err != nil {
		return wl, fmt.Errorf("list webhook deliveries: %w", err)
	}
	total, err := c.countRows(ctx, webhookCountQuery(statuses, false), pgx.NamedArgs{}, countCap)
	if err != nil {
		return wl, fmt.Errorf("count webhook deliveries: %w", err)
	}
	rank := func(first int64) (capped, error) {
		return c.countRows(ctx, webhookCountQuery(statuses, true), pgx.NamedArgs{"first": first}, countCap)
	}
	lp := listPage[webhookRow]{}
	if err := fillPage(&lp, read, n, k, func(r webhookRow) int64 { return r.ID }, rank, total); err != nil {
		return wl, fmt.Errorf("count webhook deliveries: %w", err)
	}
	lp.Pager.links(url.Values{"status": {status}}, "/webhooks", lp.Prev, lp.Next, k == keyset{})
	wl.Rows, wl.Pager = lp.Rows, lp.Pager
	return wl, nil
}

func (c *Console) webhooksPage(w http.ResponseWriter, r *http.Request, s session) {
	p := c.pageFor(s, "Webhook deliveries")
	if c.cfg.FrameworkOnly {
		p.Data = webhookList{NotInstalled: true}
		c.render(w, http.StatusOK, "webhooks", p)
		return
	}
	k, err := keysetOf(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	wl, err := c.readWebhooks(r.Context(), r.URL.Query().Get("status"), k)
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
