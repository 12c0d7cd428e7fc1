package endpoints_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/outflow-dev/outflow/outflowtest"
	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/endpoints"
	"github.com/outflow-dev/outflow/webhooks/schema"
	"github.com/outflow-dev/outflow/webhooks/secretseal"
)

// exampleT stands in for the *testing.T a test gets: examples have none.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func (*exampleT) Helper()                   {}
func (*exampleT) Output() io.Writer         { return io.Discard }
func (e *exampleT) Cleanup(f func())        { e.cleanups = append(e.cleanups, f) }
func (*exampleT) Errorf(f string, a ...any) { fmt.Fprintf(os.Stdout, f+"\n", a...) }
func (*exampleT) FailNow()                  { panic("example failed") }
func (e *exampleT) Fatalf(f string, a ...any) {
	e.Errorf(f, a...)
	e.FailNow()
}

func (e *exampleT) finish() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

func Example() {
	t := &exampleT{}
	defer t.finish()
	ctx := context.Background()
	pool := outflowtest.NewSchema(t, schema.Set()).Pool // in a service: its pool, the "webhooks" set migrated

	// In production: secretseal.ParseKey(os.Getenv(secretseal.KeyEnv)).
	key, _ := secretseal.NewKey(make([]byte, secretseal.KeySize))
	store, err := endpoints.New(endpoints.Config{SecretKey: key, APIVersion: "2026-03-01"})
	if err != nil {
		panic(err)
	}

	created, err := store.Create(ctx, pool, "acct_42", endpoints.NewEndpoint{
		URL:        "https://shop.example.com/webhooks",
		EventTypes: []string{"order.*", "refund.created"},
	})
	if err != nil {
		panic(err)
	}
	// The secret is shown this once; the account verifies signatures with it.
	fmt.Println(strings.HasPrefix(created.Secret, "whsec_"), created.APIVersion, created.EventTypes)

	// Another account cannot see it, nor tell it from one that does not exist.
	_, err = store.Get(ctx, pool, "acct_7", created.ID)
	fmt.Println(errors.Is(err, webhooks.ErrNotFound))

	// Bad input names the JSON field.
	_, err = store.Create(ctx, pool, "acct_42", endpoints.NewEndpoint{URL: "https://10.0.0.5/hook"})
	var ve *webhooks.ValidationError
	fmt.Println(errors.As(err, &ve), ve.Field)

	// A rotation: the previous secret still signs for a day.
	rotated, _ := store.RotateSecret(ctx, pool, "acct_42", created.ID)
	fmt.Println(rotated.Secret != created.Secret, rotated.PreviousSecretExpiresAt != nil)

	disabled, _ := store.Disable(ctx, pool, "acct_42", created.ID)
	fmt.Println(disabled.Disabled, disabled.DisabledReason)
	// Output:
	// true 2026-03-01 [order.* refund.created]
	// true
	// true url
	// true true
	// true manual
}
