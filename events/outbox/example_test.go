package outbox_test

import (
	"context"
	"errors"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/events"
	"github.com/outflow-dev/outflow/events/outbox"
)

// A billing service's event: each service defines its own.
const invoiceAggregate = "invoice"

type invoicePaid struct {
	InvoiceID  string    `json:"invoice_id"`
	CustomerID string    `json:"customer_id"`
	Amount     int64     `json:"amount"`
	Currency   string    `json:"currency"`
	PaidAt     time.Time `json:"paid_at"`
}

func (invoicePaid) EventType() string { return "invoice.paid" }

// The state change and its event commit or roll back together.
func ExampleWriter_PublishTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	writer, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "invoices"}})
	if err != nil {
		panic(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... lock the invoice, mark it paid, write the ledger, all on tx ...
		ev, err := events.New(ctx, events.Aggregate{Type: invoiceAggregate, ID: "inv_1", Version: 2},
			invoicePaid{InvoiceID: "inv_1", CustomerID: "cus_1", Amount: 1250, Currency: "EUR", PaidAt: time.Now()})
		if err != nil {
			return err
		}
		return writer.PublishTx(ctx, tx, ev)
	})
	if err != nil {
		panic(err)
	}
}

// A command writes its state change and its event in one transaction,
// the event in one call.
func ExampleWriter_WriteTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	writer, err := outbox.NewWriter(outbox.Config{Routes: outbox.Routes{"*": "invoices"}})
	if err != nil {
		panic(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... lock the invoice, mark it paid (its version is now 2), all on tx ...
		return writer.WriteTx(ctx, tx, events.Aggregate{Type: invoiceAggregate, ID: "inv_1", Version: 2},
			invoicePaid{InvoiceID: "inv_1", CustomerID: "cus_1", Amount: 1250, Currency: "EUR", PaidAt: time.Now()})
	})
	if err != nil {
		panic(err)
	}
}

// QueueTx puts the outbox INSERT in the batch that carries the command's
// other writes, so the event costs no round trip of its own.
func ExampleWriter_QueueTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	writer, err := outbox.NewWriter(outbox.Config{})
	if err != nil {
		panic(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`UPDATE invoices SET status = 'paid', version = version + 1 WHERE id = $1`, "inv_1")
		ev, err := events.New(ctx, events.Aggregate{Type: invoiceAggregate, ID: "inv_1", Version: 2},
			invoicePaid{InvoiceID: "inv_1", CustomerID: "cus_1", Amount: 1250, Currency: "EUR", PaidAt: time.Now()})
		if err != nil {
			return err
		}
		if err := writer.QueueTx(ctx, tx, b, ev); err != nil {
			return err
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		panic(err)
	}
}

// A statement's lines, a body that may outgrow the broker.
type statementIssued struct {
	StatementID string   `json:"statement_id"`
	Lines       []string `json:"lines,omitempty"`
	LinesRef    string   `json:"lines_ref,omitempty"`
}

func (statementIssued) EventType() string { return "statement.issued" }

// An event larger than the limit is refused inside the transaction, before
// anything is written: the caller writes a smaller one instead (or rolls
// back). With Config.Broker, the broker's own limit is the ceiling.
func ExampleErrEventTooLarge() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	writer, err := outbox.NewWriter(outbox.Config{MaxEventBytes: 256 << 10})
	if err != nil {
		panic(err)
	}
	lines := make([]string, 100_000)
	agg := events.Aggregate{Type: "statement", ID: "st_1", Version: 1}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		err := writer.WriteTx(ctx, tx, agg, statementIssued{StatementID: "st_1", Lines: lines})
		var tooLarge *outbox.EventTooLargeError
		if !errors.As(err, &tooLarge) { // errors.Is(err, outbox.ErrEventTooLarge) says the same
			return err
		}
		log.Printf("%d bytes over a limit of %d: the lines go by reference", tooLarge.Size, tooLarge.Limit)
		if _, err := tx.Exec(ctx, `INSERT INTO statement_lines (statement_id, lines) VALUES ($1, $2)`, "st_1", lines); err != nil {
			return err
		}
		return writer.WriteTx(ctx, tx, agg, statementIssued{StatementID: "st_1", LinesRef: "statement_lines/st_1"})
	})
	if err != nil {
		panic(err)
	}
}

// Payloads of 64 KiB or more travel by reference: the body goes into
// outflow_claim_bodies in the same transaction, the event carries its
// reference (package claimcheck), and MaxEventBytes applies to what
// travels. Consumers (package consumer) fetch and verify the body before
// the handler sees it; their role needs outflow_claim_reader.
func ExampleClaimCheck() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	writer, err := outbox.NewWriter(outbox.Config{
		Routes:     outbox.Routes{"*": "invoices"},
		ClaimCheck: outbox.ClaimCheck{Threshold: 64 << 10},
	})
	if err != nil {
		panic(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return writer.WriteTx(ctx, tx, events.Aggregate{Type: invoiceAggregate, ID: "inv_1", Version: 2},
			invoicePaid{InvoiceID: "inv_1", CustomerID: "cus_1", Amount: 1250, Currency: "EUR", PaidAt: time.Now()})
	})
	if err != nil {
		panic(err)
	}
}
