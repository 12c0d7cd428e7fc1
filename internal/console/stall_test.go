package console_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/outflowtest"
)

// The console never stalls with the database: with a lock held on any
// table the overview reads, the overview and its live fragment still
// answer, the panels that read the locked table say they are unavailable
// and the others show their numbers; the other pages answer too, with
// their page or a 503 that says the database did not answer.
func TestConsoleAnswersWithATableLocked(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		table       string
		unavailable []string // panels that read it
	}{
		{"outbox", []string{"outbox"}},
		{"outbox_partitions", []string{"outbox", "partitions"}},
		{"outbox_partition_sets", []string{"outbox"}},
		{"outbox_failures", []string{"outbox"}},
		{"outbox_forwarders", []string{"partitions"}},
		{"dead_letters", []string{"consumers"}},
		{"webhook_endpoint_deliveries", []string{"webhooks"}},
	} {
		t.Run(tt.table, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, stalls)
			c := e.client(t)
			c.Timeout = 5 * time.Second // far above ReadTimeout: a stall fails the request, not the wait
			e.login(t, c)
			e.insertOutbox(t, "pay-1", 1, false, false)

			e.lockTable(t, tt.table)

			for _, path := range []string{"/", "/fragments/overview", "/", "/fragments/overview"} {
				// A panel that reads the locked table is unavailable every
				// time; one that does not is shown, though on a loaded
				// machine its read can pass the 700 ms once: asked again.
				var body, missing string
				outflowtest.WaitFor(t, 30*time.Second, path+": the panels that do not read "+tt.table+" shown", func() bool {
					var res *http.Response
					res, body = do(t, c, http.MethodGet, e.srv.URL+path, nil)
					require.Equal(t, http.StatusOK, res.StatusCode, "%s: %s", path, body)
					missing = ""
					for _, panel := range []string{"outbox", "webhooks", "consumers", "partitions"} {
						marker := `id="` + panel + `-unavailable"`
						if contains(tt.unavailable, panel) {
							require.Contains(t, body, marker, "%s: the %s panel reads %s", path, panel, tt.table)
						} else if strings.Contains(body, marker) {
							missing = panel
						}
					}
					return missing == ""
				})
				require.Contains(t, body, "Unavailable: the database did not answer within 700ms.")
			}
			if !contains(tt.unavailable, "consumers") {
				_, body := do(t, c, http.MethodGet, e.srv.URL+"/", nil)
				require.Contains(t, body, `data-consumer="notify-merchant"`, "the panels that can be read are shown")
			}
			for _, path := range []string{"/parked", "/dead", "/journey?q=pay-1", "/actions", "/search", "/search?event_type=payment.paid", "/webhooks"} {
				res, body := do(t, c, http.MethodGet, e.srv.URL+path, nil)
				switch res.StatusCode {
				case http.StatusOK:
				case http.StatusServiceUnavailable:
					require.Contains(t, body, "the database did not answer within 700ms", path)
				default:
					t.Fatalf("%s: status %d: %s", path, res.StatusCode, body)
				}
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}
