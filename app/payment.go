package app

import (
	"fmt"
	"time"
)

// Status is a payment's state.
type Status string

// The payment state machine:
//
//	pending -> paid -> partially_refunded -> refunded
//	              \_______________________/
//	pending -> canceled
const (
	StatusPending           Status = "pending"
	StatusPaid              Status = "paid"
	StatusPartiallyRefunded Status = "partially_refunded"
	StatusRefunded          Status = "refunded"
	StatusCanceled          Status = "canceled"
)

// Payment is the payment aggregate.
type Payment struct {
	ID             string    `json:"id"`
	MerchantID     string    `json:"merchant_id"`
	Amount         int64     `json:"amount"`
	RefundedAmount int64     `json:"refunded_amount"`
	Currency       string    `json:"currency"`
	Status         Status    `json:"status"`
	Version        int64     `json:"version"`
	CreatedAt      time.Time `json:"created_at"`
	UpdatedAt      time.Time `json:"updated_at"`
}

// pay moves a pending payment to paid.
func (p Payment) pay(now time.Time) (Payment, error) {
	if p.Status != StatusPending {
		return p, &TransitionError{From: p.Status, Action: "pay"}
	}
	p.Status = StatusPaid
	return p.bump(now), nil
}

// cancel moves a pending payment to canceled.
func (p Payment) cancel(now time.Time) (Payment, error) {
	if p.Status != StatusPending {
		return p, &TransitionError{From: p.Status, Action: "cancel"}
	}
	p.Status = StatusCanceled
	return p.bump(now), nil
}

// refund refunds amount, or everything still refundable when amount is nil.
// It returns the updated payment and the amount refunded.
func (p Payment) refund(amount *int64, now time.Time) (Payment, int64, error) {
	if p.Status != StatusPaid && p.Status != StatusPartiallyRefunded {
		return p, 0, &TransitionError{From: p.Status, Action: "refund"}
	}
	refundable := p.Amount - p.RefundedAmount
	r := refundable
	if amount != nil {
		r = *amount
	}
	switch {
	case r <= 0:
		return p, 0, &ValidationError{Field: "amount", Message: "must be a positive integer in minor units"}
	case r > MaxAmount:
		// Only a payment made before the cap can be refunded more: in parts.
		return p, 0, &ValidationError{Field: "amount", Message: fmt.Sprintf("must be at most %d minor units", MaxAmount)}
	case r > refundable:
		return p, 0, &ValidationError{Field: "amount", Message: fmt.Sprintf("exceeds the refundable amount %d", refundable)}
	}
	p.RefundedAmount += r
	if p.RefundedAmount == p.Amount {
		p.Status = StatusRefunded
	} else {
		p.Status = StatusPartiallyRefunded
	}
	return p.bump(now), r, nil
}

func (p Payment) bump(now time.Time) Payment {
	p.Version++
	p.UpdatedAt = now
	return p
}
