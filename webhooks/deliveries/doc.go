// Package deliveries is what an account sees and does about its webhook
// deliveries: the deliveries of an endpoint ([List]) and their attempts
// ([Attempts]), a message sent again ([Resend]), every failure since a
// time sent again ([Recover]), a test event ([SendTest]); the retention
// of settled deliveries ([Purge]), which the service runs; and the counts
// an operator watches over every account ([ReadStats]: the queue, the
// failed, the endpoints disabled or with an open circuit, the oldest due
// delivery's wait), each read through a partial index.
//
// Every call but Purge and ReadStats takes the account: an endpoint, message or
// delivery of another account is [webhooks.ErrNotFound], as one that
// does not exist, so that an account learns nothing of another's. An id
// that is not a uuid is not found either, not a bad request. Bad filters
// are a [*webhooks.ValidationError] naming the query parameter.
//
// Why these rules:
//
//   - A resend or a recovery restarts the delivery's schedule (pending,
//     attempt 0, due now): the account fixed its endpoint and wants the
//     message now, not at the end of a backoff of days. The attempts made
//     before stay listed.
//   - A delivery in flight (leased by a sender, the lease not lapsed) is
//     not resent: taking its lease would send it twice at once, and the
//     attempt under way is the resend the account wants. Resend answers
//     with its current state.
//   - A disabled endpoint gets nothing ([ErrEndpointDisabled]): it was
//     disabled by its account, or for failing for days; enabling it is
//     the account's decision, and Recover then sends what failed
//     meanwhile (disabling fails its pending deliveries).
//   - While an endpoint's circuit is open, a resent or recovered delivery
//     waits for its end like any other of the endpoint's: the circuit is
//     what keeps a failing endpoint from taking the sender's capacity.
//   - List is newest first by creation on the index (endpoint_id,
//     created_at): a page reads its own rows, however far the cursor.
//   - Purge deletes settled deliveries only, oldest first, in short
//     transactions that skip what another holds; a message goes with its
//     last delivery, never before (its payload is what a pending or
//     resent delivery sends).
package deliveries
