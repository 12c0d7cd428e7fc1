package console_test

import (
	"context"
	"fmt"
	"html"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/internal/console"
)

// insertHeld adds a held dead letter, as the idempotency layer parks a
// gap, with the text it wrote before it said "was applied".
func (e *env) insertHeld(t *testing.T, consumer, messageID, aggID string, version int) int64 {
	t.Helper()
	var id int64
	require.NoError(t, e.pool.QueryRow(context.Background(), `
		INSERT INTO dead_letters (consumer, message_id, event_type, aggregate_type, aggregate_id, aggregate_version, payload, metadata,
		                          status, reason, error)
		VALUES ($1, $2, 'payment.paid', 'payment', $3, $4, '\x7b7d', '{}', 'held', 'gap', $5) RETURNING id`,
		consumer, messageID, aggID, version, fmt.Sprintf("version %d arrived before version %d", version, version-1)).Scan(&id))
	return id
}

// outcomeRow is the journey's row of a consumer's outcome of an event.
func outcomeRow(t *testing.T, body string, eventID int64, consumer string) string {
	t.Helper()
	sec := strings.Split(body, `<section class="event" id="event-`+strconv.FormatInt(eventID, 10)+`"`)
	require.Len(t, sec, 2, "event %d shown", eventID)
	sec[1] = strings.Split(sec[1], "</section>")[0]
	m := regexp.MustCompile(`(?s)<tr class="outcome" data-consumer="` + consumer + `".*?</tr>`).FindString(sec[1])
	require.NotEmpty(t, m, "outcome of %s for event %d", consumer, eventID)
	return m
}

// A held event says what it waits behind as it is now: the version before
// it is dead (retry or discard it), with the link to that dead letter's
// page; a chain of held versions names the one that holds them; a held
// event whose predecessor has no dead letter keeps its text (the version
// has not arrived). A dead letter's link opens the /dead page that holds
// it, not the list's first; the journey's ids are links.
func TestJourneyHeldBehindADeadVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *console.Config) { c.PageSize = 10 }) // the lists' pages too: 10 rows
	const pay = "0190c0de-0000-7000-8000-0000000000cc"
	// Earlier dead letters of analytics: the one of this payment is on
	// the list's second page.
	for i := range 12 {
		e.insertDead(t, "analytics", fmt.Sprintf("00000000-0000-0000-0000-%012d", i+1), fmt.Sprint("other-", i), 1, "dead")
	}
	v1 := e.insertOutbox(t, pay, 1, true, false)
	v2 := e.insertOutbox(t, pay, 2, true, false)
	v3 := e.insertOutbox(t, pay, 3, true, false)
	v4 := e.insertOutbox(t, pay, 4, true, false)
	v5 := e.insertOutbox(t, pay, 5, true, false)
	_ = v1
	dead2 := e.insertDead(t, "analytics", e.messageID(t, v2), pay, 2, "dead")
	e.insertHeld(t, "analytics", e.messageID(t, v3), pay, 3)
	e.insertHeld(t, "analytics", e.messageID(t, v5), pay, 5) // version 4 has not reached analytics
	retrying := e.insertDead(t, "notify-merchant", e.messageID(t, v2), pay, 2, "retrying")
	e.insertHeld(t, "notify-merchant", e.messageID(t, v3), pay, 3)
	e.insertHeld(t, "notify-merchant", e.messageID(t, v4), pay, 4)
	c := e.client(t)
	e.login(t, c)
	res, body := do(t, c, http.MethodGet, e.srv.URL+"/journey?q="+pay, nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	deadHref := func(consumer string, id int64) string {
		return fmt.Sprintf("/dead?at=%d&amp;consumer=%s#dead-%d", id, consumer, id)
	}

	row := outcomeRow(t, body, v3, "analytics")
	require.NotContains(t, row, "arrived before version 2", "version 2 arrived, and is dead")
	require.Contains(t, row, `held behind version 2, which is dead: retry or discard it (<a href="`+deadHref("analytics", dead2)+`" class="blocker-link">dead letter #`+strconv.FormatInt(dead2, 10)+`</a>)`)
	row = outcomeRow(t, body, v3, "notify-merchant")
	require.Contains(t, row, `held behind version 2, which failed and is retried (<a href="`+deadHref("notify-merchant", retrying)+`"`)
	row = outcomeRow(t, body, v4, "notify-merchant")
	require.Contains(t, row, `held behind version 3, held in turn behind version 2, which failed and is retried (<a href="`+deadHref("notify-merchant", retrying)+`"`)
	row = outcomeRow(t, body, v5, "analytics")
	require.Contains(t, row, `<td class="error">version 5 arrived before version 4</td>`, "version 4 has no dead letter: the text stands")

	// The dead letter's own link opens the page that holds it.
	row = outcomeRow(t, body, v2, "analytics")
	m := regexp.MustCompile(`<a href="([^"]+)" class="dead-link">#` + strconv.FormatInt(dead2, 10) + `</a>`).FindStringSubmatch(row)
	require.NotNil(t, m, row)
	href := html.UnescapeString(m[1])
	res, page := do(t, c, http.MethodGet, e.srv.URL+href, nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, page, `id="dead-`+strconv.FormatInt(dead2, 10)+`"`, "the page the link opens holds the dead letter")
	res, page = do(t, c, http.MethodGet, e.srv.URL+"/dead?consumer=analytics", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.NotContains(t, page, `id="dead-`+strconv.FormatInt(dead2, 10)+`"`, "not on the first page: the link must not open it")

	// Every id a link: the aggregate (its events in the search), each
	// message (its journey, on it).
	require.Contains(t, body, `<a href="/search?aggregate_type=payment&amp;id=`+pay+`" id="journey-aggregate">`)
	mid := e.messageID(t, v3)
	require.Contains(t, body, `<a href="/journey?q=`+mid+`#event-`+strconv.FormatInt(v3, 10)+`" class="message-link">`)
}

// A webhook delivery's id is a link to its row on the journey.
func TestJourneyDeliveryIsALink(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	v1 := e.insertOutbox(t, "0190c0de-0000-7000-8000-0000000000dd", 1, true, false)
	ep := e.hookEndpoint(t, testAccount, "https://example.com/hook")
	mid := e.hookMessage(t, testAccount, ep, e.messageID(t, v1), "payment.paid")
	var del int64
	require.NoError(t, e.pool.QueryRow(context.Background(), `UPDATE webhook_endpoint_deliveries SET status = 'failed', attempts = 5,
		settled_at = now() WHERE message_id = $1 RETURNING id`, mid).Scan(&del))
	c := e.client(t)
	e.login(t, c)
	_, body := do(t, c, http.MethodGet, e.srv.URL+"/journey?q="+e.messageID(t, v1), nil)
	d := strconv.FormatInt(del, 10)
	require.Contains(t, body, `<tr class="delivery" id="delivery-`+d+`" data-status="failed"><td colspan="5"><a href="#delivery-`+d+`" class="delivery-link">#`+d+`</a>`)
	// Its endpoint's URL leads to the message's attempts on the endpoint's page.
	require.Contains(t, body, `<a href="/webhooks/endpoints/`+ep+`?message=`+mid+`" class="endpoint-link">https://example.com/hook</a>: failed`)
}
