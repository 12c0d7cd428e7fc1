package handlers

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/consumer"
	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/webhooks/fanout"
)

// NotifyName is the consumer name of [NotifyMerchant]: its processed
// messages, consumer group and dead letters. It is the one the earlier
// releases' handler had, so that a message one of them handled is not
// handled again by this one during a rolling upgrade.
const NotifyName = "notify-merchant"

// NotifyEventTypes are the events a merchant's endpoints are sent.
var NotifyEventTypes = []string{paymentevents.Paid{}.EventType(), paymentevents.Refunded{}.EventType()}

// ErrUnknownMerchant is returned by NotifyMerchant's handler for an event
// whose merchant is not in the consumer's database: the message is retried,
// then dead-lettered with that reason, rather than dropped.
var ErrUnknownMerchant = errors.New("unknown merchant")

// NotifyMerchant tells merchants about their paid and refunded payments
// through the webhook package ([fanout.Handler]): inside the consumer's
// transaction it records one message per event (its id, the webhook-id
// every endpoint receives, is the event's message id) and a delivery per
// endpoint of the merchant that wants the event type; the sender
// (package webhooks/sender) makes the calls afterwards, outside any
// transaction, signed with each endpoint's secret (Standard Webhooks). The
// account is the merchant id, in its canonical form: migration 00034 gave
// every merchant an endpoint whose id is the merchant's, receiving every
// event type at the merchant's webhook_url, so a merchant that made no
// other endpoint receives what it did before, in the same body
// ({"type", "timestamp", "data"}: webhooks.DefaultRenderer).
//
// An event whose merchant is not in the consumer's database is an error
// ([ErrUnknownMerchant], naming the merchant): retried, then dead-lettered
// for an operator (`outflow dlq list`), never dropped. A merchant with no
// endpoint that wants the event gets nothing recorded.
//
// Of cfg only Wake (the sender's Wake, called once the recording
// transaction committed) and Logger are used; the pool is unused (the
// handler runs in the consumer's transaction) and kept for the callers
// of earlier releases.
func NotifyMerchant(_ *pgxpool.Pool, cfg NotifyConfig) consumer.Handler {
	return fanout.Handler(NotifyName, app.PaymentsTopic, fanout.Config{
		Account: merchantAccount, Wake: cfg.Wake, Logger: cfg.Logger,
	}, NotifyEventTypes...)
}

// merchantAccount is the account of a paid or refunded event: its
// merchant's id as the merchants table spells it, or ErrUnknownMerchant.
func merchantAccount(ctx context.Context, tx pgx.Tx, ev events.Event) (string, error) {
	var merchantID string
	switch p := ev.Payload.(type) {
	case paymentevents.Paid:
		merchantID = p.MerchantID
	case paymentevents.Refunded:
		merchantID = p.MerchantID
	default:
		return "", fmt.Errorf("notify-merchant: unexpected payload %T of %s", ev.Payload, ev.EventType)
	}
	// A merchant id is a uuid: anything else names no merchant (rather
	// than failing the statement, which would dead-letter the event with
	// a cast error instead of the reason).
	id, err := uuid.Parse(merchantID)
	if err != nil {
		return "", fmt.Errorf("notify-merchant: merchant %q: %w", merchantID, ErrUnknownMerchant)
	}
	var account string
	err = tx.QueryRow(ctx, `SELECT id::text FROM merchants WHERE id = $1`, id).Scan(&account)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("notify-merchant: merchant %s: %w", merchantID, ErrUnknownMerchant)
	}
	if err != nil {
		return "", fmt.Errorf("notify-merchant: look up merchant %s: %w", merchantID, err)
	}
	return account, nil
}
