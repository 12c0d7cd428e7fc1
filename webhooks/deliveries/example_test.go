package deliveries_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/deliveries"
)

// An account reads its endpoint's failed deliveries a page at a time,
// resends one, and an API answers the errors: not found (another
// account's alike), a disabled endpoint, a bad filter.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	account, endpoint := "merchant-42", "0193c4f6-7a3e-7b1c-9d2e-5f6a7b8c9d0e"

	status := func(err error) int {
		var v *webhooks.ValidationError
		switch {
		case err == nil:
			return 200
		case errors.Is(err, webhooks.ErrNotFound):
			return 404
		case errors.Is(err, deliveries.ErrEndpointDisabled):
			return 409
		case errors.As(err, &v):
			return 400
		}
		return 500
	}

	f := deliveries.Filter{Status: deliveries.StatusFailed, Limit: 100}
	for {
		page, err := deliveries.List(ctx, pool, account, endpoint, f)
		if err != nil {
			fmt.Println(status(err), err)
			return
		}
		for _, d := range page.Data {
			if _, err := deliveries.Resend(ctx, pool, account, endpoint, d.MessageID); err != nil {
				fmt.Println(status(err), err)
				return
			}
		}
		if page.NextCursor == nil {
			break
		}
		f.Before = *page.NextCursor
	}
	// The same, in one statement, for the last day's failures.
	n, err := deliveries.Recover(ctx, pool, account, endpoint, time.Now().Add(-24*time.Hour))
	fmt.Println(status(err), n)
}

// An operator's check, over every account: the failed deliveries wait
// for someone, and a due delivery waiting long says the sender is behind.
func ExampleReadStats() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	s, err := deliveries.ReadStats(ctx, pool)
	if err != nil {
		panic(err)
	}
	if s.Failed > 0 || s.OldestDueAge > time.Minute {
		fmt.Printf("webhooks: %d failed, %d failing, %d endpoints disabled, %d with an open circuit; oldest due %s\n",
			s.Failed, s.Failing, s.EndpointsDisabled, s.EndpointsCircuitOpen, s.OldestDueAge.Round(time.Second))
	}
}
