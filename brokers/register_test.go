package brokers_test

import (
	"context"
	"errors"
	"testing"

	"github.com/outflow-dev/outflow/brokers"
)

var errOpened = errors.New("opened")

// A backend of one's own registers under a kind of its own: ParseKind
// accepts it and Open hands it the Config with its defaults set. A second
// registration of a kind panics.
func TestRegisterOwnBackend(t *testing.T) {
	var got brokers.Config
	brokers.Register("test-own", func(_ context.Context, cfg brokers.Config) (brokers.Backend, error) {
		got = cfg
		return nil, errOpened
	})
	k, err := brokers.ParseKind("Test-Own")
	if err != nil || k != "test-own" {
		t.Fatalf("ParseKind = %q, %v", k, err)
	}
	if _, err := brokers.Open(context.Background(), brokers.Config{Kind: k}); !errors.Is(err, errOpened) {
		t.Fatalf("Open: %v, want the registered opener's", err)
	}
	if got.StreamPartitions != 1 || got.Logger == nil {
		t.Fatalf("the opener got no defaults: %+v", got)
	}
	for _, kind := range []brokers.Kind{"test-own", brokers.Redis, ""} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%q) again did not panic", kind)
				}
			}()
			brokers.Register(kind, func(context.Context, brokers.Config) (brokers.Backend, error) { return nil, nil })
		}()
	}
}
