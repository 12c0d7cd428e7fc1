package app

import (
	"fmt"
)

// Ledger accounts. Amounts are signed: a debit is positive, a credit
// negative, and every ledger transaction sums to zero per currency.
const accountCash = "psp:cash"

func merchantPayable(merchantID string) string { return "merchant:" + merchantID + ":payable" }

// Entry is one leg of a ledger transaction.
type Entry struct {
	Account  string
	Amount   int64
	Currency string
}

// LedgerTx is a balanced set of entries recording one money movement.
type LedgerTx struct {
	ID        string
	PaymentID string
	Kind      string
	Entries   []Entry
}

// Validate checks the double-entry rule: at least two non-zero legs that sum
// to zero per currency. The database checks the same at commit.
func (t LedgerTx) Validate() error {
	if len(t.Entries) < 2 {
		return fmt.Errorf("%w: %s has %d entries, need at least 2", ErrUnbalanced, t.Kind, len(t.Entries))
	}
	sums := make(map[string]int64)
	for _, e := range t.Entries {
		if e.Amount == 0 {
			return fmt.Errorf("%w: %s has a zero entry on %s", ErrUnbalanced, t.Kind, e.Account)
		}
		sums[e.Currency] += e.Amount
	}
	for cur, s := range sums {
		if s != 0 {
			return fmt.Errorf("%w: %s sums to %d %s", ErrUnbalanced, t.Kind, s, cur)
		}
	}
	return nil
}

// paymentCaptured moves money from the customer (cash in) to what we owe
// the merchant.
func paymentCaptured(id string, p Payment) LedgerTx {
	return LedgerTx{ID: id, PaymentID: p.ID, Kind: "payment_captured", Entries: []Entry{
		{Account: accountCash, Amount: p.Amount, Currency: p.Currency},
		{Account: merchantPayable(p.MerchantID), Amount: -p.Amount, Currency: p.Currency},
	}}
}

// paymentRefunded reverses part of a capture.
func paymentRefunded(id string, p Payment, amount int64) LedgerTx {
	return LedgerTx{ID: id, PaymentID: p.ID, Kind: "payment_refunded", Entries: []Entry{
		{Account: merchantPayable(p.MerchantID), Amount: amount, Currency: p.Currency},
		{Account: accountCash, Amount: -amount, Currency: p.Currency},
	}}
}
