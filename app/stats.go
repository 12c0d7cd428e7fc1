package app

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// CurrencyStats is a merchant's analytics in one currency.
type CurrencyStats struct {
	Currency       string `json:"currency"`
	PaidCount      int64  `json:"paid_count"`
	PaidAmount     Total  `json:"paid_amount"`
	RefundedAmount Total  `json:"refunded_amount"`
}

// MerchantStats is the SyncAnalytics projection of one merchant. The
// top-level amounts add up every currency's minor units: they mean money
// only for a merchant paid in one currency; ByCurrency is always exact.
type MerchantStats struct {
	MerchantID     string          `json:"merchant_id"`
	PaidCount      int64           `json:"paid_count"`
	PaidAmount     Total           `json:"paid_amount"`
	RefundedAmount Total           `json:"refunded_amount"`
	ByCurrency     []CurrencyStats `json:"by_currency"`
}

// GetMerchantStats reads the projection the SyncAnalytics consumer keeps.
// It is eventually consistent: events reach it through the outbox, the
// forwarder and the broker. The sums are numeric, in the table and here,
// and read into a [Total]: they cannot wrap, so a merchant paid any number
// of maximal amounts sees them added up, never a negative or an error.
func (s *Service) GetMerchantStats(ctx context.Context, merchantID string) (MerchantStats, error) {
	m, err := s.GetMerchant(ctx, merchantID)
	if err != nil {
		return MerchantStats{}, err
	}
	rows, err := s.pool.Query(ctx, `
		SELECT currency, sum(paid_count)::bigint, sum(paid_amount), sum(refunded_amount)
		FROM merchant_stats_daily WHERE merchant_id = $1 GROUP BY currency ORDER BY currency`, m.ID)
	if err != nil {
		return MerchantStats{}, fmt.Errorf("read merchant stats: %w", err)
	}
	by, err := pgx.CollectRows(rows, pgx.RowToStructByPos[CurrencyStats])
	if err != nil {
		return MerchantStats{}, fmt.Errorf("read merchant stats: %w", err)
	}
	out := MerchantStats{MerchantID: m.ID, ByCurrency: by}
	if out.ByCurrency == nil {
		out.ByCurrency = []CurrencyStats{}
	}
	for _, c := range by {
		out.PaidCount += c.PaidCount
		out.PaidAmount = out.PaidAmount.Plus(c.PaidAmount)
		out.RefundedAmount = out.RefundedAmount.Plus(c.RefundedAmount)
	}
	return out, nil
}
