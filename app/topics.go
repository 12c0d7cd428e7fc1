package app

import (
	"github.com/outflow-dev/outflow/app/paymentevents"
	"github.com/outflow-dev/outflow/events/outbox"
)

// PaymentsTopic carries every payment event, so that one stream holds each
// payment's whole history in order.
const PaymentsTopic = "payments"

// Routes is the service's topic routing table.
var Routes = outbox.Routes{
	paymentevents.CreatedType:  PaymentsTopic,
	paymentevents.PaidType:     PaymentsTopic,
	paymentevents.RefundedType: PaymentsTopic,
	paymentevents.CanceledType: PaymentsTopic,
}
