// Package sender makes the HTTP calls of the webhook deliveries that
// [github.com/outflow-dev/outflow/webhooks/fanout.Enqueue] recorded,
// outside any transaction.
//
// Why it is shaped this way:
//
//   - Leases, not locks held across a request. A delivery is leased (a
//     fresh token, valid for Timeout + LeaseMargin) in a short
//     transaction; the request runs with no transaction open and is
//     cancelled at Timeout, so another Sender can take the delivery only
//     once this one's request has ended. Its result is applied only under
//     the same token while the delivery is pending: a late result is
//     recorded with lease_lost and decides nothing. Leases and results
//     commit without waiting for their WAL flush: one a PostgreSQL crash
//     forgets means a webhook sent twice, never one lost.
//   - What an endpoint is sent is decided at send time: its URL, secrets
//     and api_version are read from the endpoint when the delivery is
//     leased (a new URL applies to pending deliveries), the body is
//     rendered by Config.Render for that api_version and signed with
//     Standard Webhooks' scheme: with the current secret and, during a
//     rotation's grace period, the previous one too. Secrets are sealed at
//     rest with the endpoint id as associated data.
//   - Failing endpoints cost the others nothing. An endpoint has at most
//     PerEndpoint requests in flight per Sender; endpoints whose last
//     attempt failed ("suspect") share SuspectConcurrency slots, so slow
//     or dead endpoints cannot take the healthy ones' slots; a request
//     running longer than SlowAfter moves to that lane, freeing its slot,
//     and makes its endpoint suspect meanwhile (so a slow endpoint's
//     first requests cannot hold every slot for a Timeout); a disabled
//     endpoint or one whose circuit is open is never leased, and its
//     pending deliveries wait out of the due scan's way; an endpoint over
//     its rate_limit is not leased until its token bucket (per process)
//     refills, rather than leased and held.
//   - A failing endpoint's backlog waits for its retry: after a failed
//     attempt that is retried, the endpoint's other pending deliveries,
//     and those recorded for it meanwhile, wait until the retry has told
//     (at most CircuitCooldownMax past the retry's time); the retry's
//     success makes them due at once. A dead endpoint then leaves one due
//     delivery in the queue, not its backlog, which the due scan would
//     otherwise walk at every lease. A 4xx that fails its delivery at
//     once holds nothing back: the endpoint answered.
//   - A circuit per endpoint: CircuitFailures failed attempts in a row (or
//     a 429/503 with Retry-After) open it for CircuitCooldown (doubling per
//     failed probe up to CircuitCooldownMax, or the Retry-After). After
//     its end one request, the probe, goes; a success closes it and makes
//     the endpoint's held-back deliveries due at once, a failure reopens
//     it. A failed request keeps its slot until its result is recorded,
//     so that the endpoint's next request sees the circuit it opened.
//   - An endpoint failing without a success for DisableAfter is disabled,
//     its pending deliveries failed ("endpoint disabled"), and an
//     endpoint.disabled notice is enqueued for the account's other
//     endpoints in the same transaction: the account learns of it
//     through the endpoints that still work.
//   - Every attempt is recorded with its status code, latency, a category
//     of its failure (never the network error itself, which may hold
//     addresses: an endpoint URL must not serve to map a network) and at
//     most MaxResponseBody bytes of the response's body, valid UTF-8 with
//     secrets masked ([github.com/outflow-dev/outflow/internal/redact.Body]).
//   - The retry schedule spreads about three days (Config.Schedule, with
//     jitter); a Retry-After replaces a step, capped at the longest one.
//     Network errors, timeouts, redirects (never followed), 408, 425, 429
//     and 5xx are retried; other 4xx fail at once.
//   - The SSRF guard checks every connection on the address it is made to
//     (unless AllowPrivate), not the name the URL held when it was saved,
//     and never goes through a proxy.
//
// Results are recorded by one goroutine, all those waiting in one
// statement that also updates the endpoints' health.
package sender
