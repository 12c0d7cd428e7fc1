package app

import (
	"errors"
	"testing"
	"time"
)

func TestPaymentTransitions(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	base := Payment{ID: "p", MerchantID: "m", Amount: 1000, Currency: "EUR", Version: 1}
	with := func(s Status, refunded int64) Payment { p := base; p.Status, p.RefundedAmount = s, refunded; return p }
	amt := func(n int64) *int64 { return &n }

	tests := []struct {
		name         string
		from         Payment
		action       string
		amount       *int64
		wantStatus   Status
		wantRefunded int64
		wantErr      error
		wantField    string
	}{
		{"pay pending", with(StatusPending, 0), "pay", nil, StatusPaid, 0, nil, ""},
		{"pay paid", with(StatusPaid, 0), "pay", nil, "", 0, ErrInvalidTransition, ""},
		{"pay canceled", with(StatusCanceled, 0), "pay", nil, "", 0, ErrInvalidTransition, ""},
		{"cancel pending", with(StatusPending, 0), "cancel", nil, StatusCanceled, 0, nil, ""},
		{"cancel paid", with(StatusPaid, 0), "cancel", nil, "", 0, ErrInvalidTransition, ""},
		{"cancel canceled", with(StatusCanceled, 0), "cancel", nil, "", 0, ErrInvalidTransition, ""},
		{"refund all of paid", with(StatusPaid, 0), "refund", nil, StatusRefunded, 1000, nil, ""},
		{"refund part of paid", with(StatusPaid, 0), "refund", amt(300), StatusPartiallyRefunded, 300, nil, ""},
		{"refund rest of partial", with(StatusPartiallyRefunded, 300), "refund", nil, StatusRefunded, 1000, nil, ""},
		{"refund exact rest", with(StatusPartiallyRefunded, 300), "refund", amt(700), StatusRefunded, 1000, nil, ""},
		{"refund more than rest", with(StatusPartiallyRefunded, 300), "refund", amt(701), "", 0, ErrInvalidInput, "amount"},
		{"refund zero", with(StatusPaid, 0), "refund", amt(0), "", 0, ErrInvalidInput, "amount"},
		{"refund negative", with(StatusPaid, 0), "refund", amt(-5), "", 0, ErrInvalidInput, "amount"},
		{"refund pending", with(StatusPending, 0), "refund", nil, "", 0, ErrInvalidTransition, ""},
		{"refund refunded", with(StatusRefunded, 1000), "refund", nil, "", 0, ErrInvalidTransition, ""},
		{"refund canceled", with(StatusCanceled, 0), "refund", nil, "", 0, ErrInvalidTransition, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var (
				got Payment
				err error
			)
			switch tt.action {
			case "pay":
				got, err = tt.from.pay(now)
			case "cancel":
				got, err = tt.from.cancel(now)
			case "refund":
				got, _, err = tt.from.refund(tt.amount, now)
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				var ve *ValidationError
				if tt.wantField != "" && (!errors.As(err, &ve) || ve.Field != tt.wantField) {
					t.Fatalf("err = %v, want a validation error on %q", err, tt.wantField)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got.Status != tt.wantStatus || got.RefundedAmount != tt.wantRefunded {
				t.Fatalf("got %s refunded %d, want %s refunded %d", got.Status, got.RefundedAmount, tt.wantStatus, tt.wantRefunded)
			}
			if got.Version != tt.from.Version+1 || !got.UpdatedAt.Equal(now) {
				t.Fatalf("version %d updated %v: every transition bumps the version once", got.Version, got.UpdatedAt)
			}
		})
	}
}

func TestLedgerTxValidate(t *testing.T) {
	t.Parallel()
	e := func(acc string, amt int64, cur string) Entry { return Entry{Account: acc, Amount: amt, Currency: cur} }
	tests := []struct {
		name    string
		entries []Entry
		ok      bool
	}{
		{"balanced", []Entry{e("a", 100, "EUR"), e("b", -100, "EUR")}, true},
		{"three legs", []Entry{e("a", 100, "EUR"), e("b", -60, "EUR"), e("c", -40, "EUR")}, true},
		{"two currencies each balanced", []Entry{e("a", 1, "EUR"), e("b", -1, "EUR"), e("a", 5, "USD"), e("b", -5, "USD")}, true},
		{"unbalanced", []Entry{e("a", 100, "EUR"), e("b", -99, "EUR")}, false},
		{"balanced across currencies only", []Entry{e("a", 100, "EUR"), e("b", -100, "USD")}, false},
		{"one leg", []Entry{e("a", 0, "EUR")}, false},
		{"zero leg", []Entry{e("a", 0, "EUR"), e("b", 0, "EUR")}, false},
		{"none", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := LedgerTx{Kind: "test", Entries: tt.entries}.Validate()
			if tt.ok != (err == nil) {
				t.Fatalf("Validate() = %v, want ok=%v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrUnbalanced) {
				t.Fatalf("err = %v, want ErrUnbalanced", err)
			}
		})
	}
}

func TestValidCurrency(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]bool{"EUR": true, "USD": true, "BRL": true, "JPY": true, "eur": false, "XYZ": false, "": false, "EURO": false, "XAU": false} {
		if got := ValidCurrency(code); got != want {
			t.Errorf("ValidCurrency(%q) = %v, want %v", code, got, want)
		}
	}
}
