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
	"time"

	"github.com/jackc/pgx/v5"
)

// The webhooks list: the deliveries of the framework's webhook tables
// (webhooks/schema) that need a look, across accounts: failing (pending
// after a failed attempt) and failed (given up, final until resent or
// recovered), newest first, each with its account, endpoint, last error
// and a link to its event's journey. Shown for any service that installed
// the webhooks migration set, FrameworkOnly or not: the console looks for
// the tables, not for the reference app.

// webhookStatuses are the list's filters: a delivery's state as the
// overview counts it.
var webhookStatuses = []string{"failing", "failed"}

var errBadWebhookStatus = fmt.Errorf("status must be empty or one of %s", strings.Join(webhookStatuses, ", "))

// maxAccount bounds an account filter: an account id is the service's
// text, and one longer than this is no account but a mistake.
const maxAccount = 200

var errBadAccount = fmt.Errorf("account must be at most %d bytes", maxAccount)

// webhooksInstalled says whether the webhooks migration set is in the
// database (its endpoints table is found on the search path). Once found,
// it is not asked again: tables installed stay.
func (c *Console) webhooksInstalled(ctx context.Context) (bool, error) {
	if c.hooksFound.Load() {
		return true, nil
	}
	var ok bool
	if err := c.cfg.Pool.QueryRow(ctx, `SELECT to_regclass('webhook_endpoints') IS NOT NULL`).Scan(&ok); err != nil {
		return false, fmt.Errorf("look for the webhook tables: %w", err)
	}
	if ok {
		c.hooksFound.Store(true)
	}
	return ok, nil
}

// webhookCond is the condition of a status's deliveries, each read
// through its partial index in id order: the failing through
// webhook_endpoint_deliveries_failing_idx, the failed through
// webhook_endpoint_deliveries_failed_idx. The status is a literal, which
// is what proves a branch within its index's predicate.
func webhookCond(status string) string {
	if status == "failing" {
		return "d.status = 'pending' AND d.attempts > 0"
	}
	return "d.status = 'failed'"
}

// webhookListQuery is the list's query for a filter, newest first: one
// branch per status, each an ordered scan of its partial index that its
// LIMIT stops, merged. A page after @after (in the list's order: ids
// below it) or, with before, before @before (ids above it, read oldest
// first: fillPage turns it). With account, only the deliveries to that
// account's endpoints (@account). Arguments: @after or @before, @limit,
// @account.
func webhookListQuery(statuses []string, before, account bool) string {
	const cols = `d.id, d.message_id::text, e.account_id, e.id::text AS endpoint_id, e.url, m.event_type, %s AS status, d.attempts,
		       coalesce(d.last_error, ''), %s AS next_attempt_at, d.created_at`
	pos, order := "d.id < @after", "id DESC"
	if before {
		pos, order = "d.id > @before", "id"
	}
	if account {
		pos += " AND e.account_id = @account"
	}
	branches := make([]string, len(statuses))
	for i, st := range statuses {
		next := "d.next_attempt_at"
		if st == "failed" {
			next = "NULL::timestamptz"
		}
		branches[i] = `(SELECT ` + fmt.Sprintf(cols, "'"+st+"'", next) + `
		FROM webhook_endpoint_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
		JOIN webhook_messages m ON m.id = d.message_id
		WHERE ` + webhookCond(st) + ` AND ` + pos + ` ORDER BY d.` + order + ` LIMIT @limit)`
	}
	if len(branches) == 1 {
		return branches[0]
	}
	return `SELECT * FROM (` + strings.Join(branches, "\n\t\tUNION ALL ") + `) d ORDER BY ` + order + ` LIMIT @limit`
}

// webhookCountQuery counts a filter's deliveries (with rank, those before
// @first in the list's order: newer), up to @cap: each status's through
// its own partial index.
func webhookCountQuery(statuses []string, rank, account bool) string {
	branches := make([]string, len(statuses))
	for i, st := range statuses {
		cond := webhookCond(st)
		from := "webhook_endpoint_deliveries d"
		if account {
			from += " JOIN webhook_endpoints e ON e.id = d.endpoint_id"
			cond += " AND e.account_id = @account"
		}
		if rank {
			cond += " AND d.id > @first"
		}
		branches[i] = `(SELECT 1 FROM ` + from + ` WHERE ` + cond + ` LIMIT @cap)`
	}
	return `SELECT count(*) FROM (` + strings.Join(branches, " UNION ALL ") + `) c`
}

type webhookRow struct {
	ID                                    int64
	MessageID, AccountID, EndpointID, URL string
	EventType, Status                     string
	Attempts                              int32
	LastError                             string
	NextAttemptAt                         *time.Time
	CreatedAt                             time.Time
}

type webhookList struct {
	Rows         []webhookRow
	Status       string
	Account      string
	Pager        pager
	NotInstalled bool // the webhooks migration set is not in this database
}

// readWebhooks reads a page of the list at k, with its pager: First,
// Previous and Next, and "Showing 51–100 of 1,234" (counts capped at
// countCap), as the other lists page.
func (c *Console) readWebhooks(ctx context.Context, status, account string, k keyset) (webhookList, error) {
	wl := webhookList{Status: status, Account: account}
	statuses := webhookStatuses
	if status != "" {
		if !slices.Contains(webhookStatuses, status) {
			return wl, errBadWebhookStatus
		}
		statuses = []string{status}
	}
	if len(account) > maxAccount {
		return wl, errBadAccount
	}
	// The list runs newest first: its "after" is below in id, and the
	// first page starts above every id.
	if k.at != 0 {
		k.after = k.at + 1
	}
	after := k.after
	if after == 0 && k.before == 0 {
		after = math.MaxInt64
	}
	n := c.cfg.PageSize
	byAccount := account != ""
	rows, err := c.cfg.Pool.Query(ctx, webhookListQuery(statuses, k.before != 0, byAccount),
		pgx.NamedArgs{"after": after, "before": k.before, "limit": n + 1, "account": account})
	if err != nil {
		return wl, fmt.Errorf("list webhook deliveries: %w", err)
	}
	read, err := pgx.CollectRows(rows, pgx.RowToStructByPos[webhookRow])
	if err != nil {
		return wl, fmt.Errorf("list webhook deliveries: %w", err)
	}
	total, err := c.countRows(ctx, webhookCountQuery(statuses, false, byAccount), pgx.NamedArgs{"account": account}, countCap)
	if err != nil {
		return wl, fmt.Errorf("count webhook deliveries: %w", err)
	}
	rank := func(first int64) (capped, error) {
		return c.countRows(ctx, webhookCountQuery(statuses, true, byAccount), pgx.NamedArgs{"first": first, "account": account}, countCap)
	}
	lp := listPage[webhookRow]{}
	if err := fillPage(&lp, read, n, k, func(r webhookRow) int64 { return r.ID }, rank, total); err != nil {
		return wl, fmt.Errorf("count webhook deliveries: %w", err)
	}
	lp.Pager.links(url.Values{"status": {status}, "account": {account}}, "/webhooks", lp.Prev, lp.Next, k == keyset{})
	wl.Rows, wl.Pager = lp.Rows, lp.Pager
	return wl, nil
}

func (c *Console) webhooksPage(w http.ResponseWriter, r *http.Request, s session) {
	p := c.pageFor(s, "Webhook deliveries")
	ok, err := c.webhooksInstalled(r.Context())
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if !ok {
		p.Data = webhookList{NotInstalled: true}
		c.render(w, http.StatusOK, "webhooks", p)
		return
	}
	k, err := keysetOf(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	q := r.URL.Query()
	wl, err := c.readWebhooks(r.Context(), q.Get("status"), strings.TrimSpace(q.Get("account")), k)
	if errors.Is(err, errBadWebhookStatus) || errors.Is(err, errBadAccount) {
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
