// Package claimcheck lets a large event body travel by reference (the
// claim check pattern; MassTransit calls it message data): the writer
// (events/outbox, Config.ClaimCheck) stores the body once, in the business
// transaction, and the event that goes through the outbox and the broker
// carries only a [Ref] in its metadata ([RefKey], [SHA256Key], [SizeKey])
// and the placeholder [Placeholder] as its payload. A consumer resolves
// the reference before decoding ([Resolve]; package consumer does it for
// every handler), verifying the body's size and sha256.
//
// The default [Store] is [Postgres]: table outflow_claim_bodies (framework
// migration 00033), readable only by the table's owner and the members of
// role outflow_claim_reader. A consumer whose role may not read it gets
// [ErrBodyForbidden]; a body purged with its event's retention
// ([PurgeBodies], run by the forwarder's and the WAL relay's purge) is
// [ErrBodyGone]; a body that does not match its reference, or a reference
// that names another message's body, is [ErrBodyTampered]
// ([ErrRefMismatch]). The purge works through migration 00033's SECURITY
// DEFINER functions, so that the forwarder's role needs neither the
// table's ownership nor the right to read a body. None of them, nor any other error of this package,
// carries any of the body. See "Large bodies by reference" in
// docs/events.md and docs/security.md.
package claimcheck
