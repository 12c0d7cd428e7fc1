package app

import (
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/events/payment"
)

// PaymentsTopic carries every payment event, so that one stream holds each
// payment's whole history in order.
const PaymentsTopic = "payments"

// Routes is the service's topic routing table.
var Routes = outbox.Routes{
	payment.CreatedType:  PaymentsTopic,
	payment.PaidType:     PaymentsTopic,
	payment.RefundedType: PaymentsTopic,
	payment.CanceledType: PaymentsTopic,
}
