package webhookapi

import (
	"encoding/json"
	"errors"
	"github.com/outflow-dev/outflow/internal/strictjson"
	"net/http"

	"github.com/outflow-dev/outflow/webhooks"
	"github.com/outflow-dev/outflow/webhooks/deliveries"
	"github.com/outflow-dev/outflow/webhooks/endpoints"
)

// MaxBody bounds request bodies: the largest, an endpoint with 100 event
// types, is a few KiB.
const MaxBody = 64 << 10

// The error body is the reference app's: {"error": {"code", "message",
// "field"}}.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", "could not encode the response", "")
		return
	}
	writeRaw(w, status, body)
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
	_, _ = w.Write([]byte("\n"))
}

func writeError(w http.ResponseWriter, status int, code, msg, field string) {
	body, _ := json.Marshal(errorBody{Error: errorDetail{Code: code, Message: msg, Field: field}})
	writeRaw(w, status, body)
}

// WriteKnownError answers the webhook packages' typed errors as these
// handlers do, and reports whether err was one: [webhooks.ErrNotFound] is
// 404 not_found, a *[webhooks.ValidationError] 422 invalid_field naming
// the field, [endpoints.ErrTooMany] 409 too_many_endpoints,
// [deliveries.ErrEndpointDisabled] (a resend, recovery or test to a
// disabled endpoint) 409 endpoint_disabled. A service
// whose Config.Command maps its own errors calls it first, so that these
// do not become 500s.
func WriteKnownError(w http.ResponseWriter, err error) bool {
	var ve *webhooks.ValidationError
	switch {
	case errors.As(err, &ve):
		writeError(w, http.StatusUnprocessableEntity, "invalid_field", ve.Error(), ve.Field)
	case errors.Is(err, webhooks.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", err.Error(), "")
	case errors.Is(err, endpoints.ErrTooMany):
		writeError(w, http.StatusConflict, "too_many_endpoints", err.Error(), "")
	case errors.Is(err, deliveries.ErrEndpointDisabled):
		writeError(w, http.StatusConflict, "endpoint_disabled",
			"the endpoint is disabled: enable it, then recover what failed meanwhile", "")
	default:
		return false
	}
	return true
}

func writeNotFound(w http.ResponseWriter, what string) {
	writeError(w, http.StatusNotFound, "not_found", what+": not found", "")
}

// decodeBody reads a JSON object into dst, refusing unknown fields, wrong
// types, trailing data and what strictjson.Check refuses, with a 4xx naming
// the field. With required false, an empty body is accepted as {}.
func decodeBody(w http.ResponseWriter, r *http.Request, dst any, required bool) bool {
	if e := strictjson.ReadBody(w, r, dst, required, MaxBody); e != nil {
		writeError(w, e.Status, e.Code, e.Message, e.Field)
		return false
	}
	return true
}
