// Package payouts is a small example service built only on Outflow's
// framework packages: a merchant asks for a payout, the service records it
// and, in the same transaction, writes a payout event to the outbox; a
// consumer keeps each merchant's payout balance from those events.
//
// It is what docs/getting-started.md walks through, and it imports nothing
// of the reference payments service (a test checks its dependency list):
// its own tables and migrations (package migrations' framework set first,
// then [Migrations]), its own events ([Requested], [Sent], [Failed]), its
// own handler ([Balances]) and its own tests, written with outflowtest.
//
// Its merchants get webhooks through the framework's webhooks packages: the
// webhook tables' migration set before its own, their API mounted behind
// its merchant API keys ([MountWebhooks]), a consumer that records a
// webhook message per payout event ([WebhookFanout]), a sender that
// delivers them, and a renderer ([RenderWebhook]) that keeps each endpoint
// on the payload version it was created for ([APIVersion] at the time).
//
// A payout is an aggregate: each change bumps its version, and the event of
// the change carries that version, so a consumer applies a payout's events
// in order whatever order the broker delivers them in.
package payouts
