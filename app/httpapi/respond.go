package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/outflow-dev/outflow/internal/strictjson"
	"log/slog"
	"net/http"

	"github.com/outflow-dev/outflow/app"
	"github.com/outflow-dev/outflow/events/outbox"
	"github.com/outflow-dev/outflow/webhooks/webhookapi"
)

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

// writeAppError maps the service's typed errors onto statuses. Anything else
// is a 500 whose detail goes to the log, not to the client.
func (a *API) writeAppError(w http.ResponseWriter, r *http.Request, err error) {
	var (
		nf *app.NotFoundError
		te *app.TransitionError
		ve *app.ValidationError
	)
	switch {
	case webhookapi.WriteKnownError(w, err): // the webhook routes' errors
	case errors.As(err, &nf):
		writeError(w, http.StatusNotFound, "not_found", nf.Error(), "")
	case errors.As(err, &te):
		writeError(w, http.StatusConflict, "invalid_transition", te.Error(), "")
	case errors.As(err, &ve):
		writeError(w, http.StatusUnprocessableEntity, "invalid_field", ve.Error(), ve.Field)
	case errors.Is(err, r.Context().Err()) && r.Context().Err() != nil:
		writeError(w, http.StatusServiceUnavailable, "canceled", "the request was canceled", "")
	default:
		a.logger.ErrorContext(r.Context(), "command failed", slog.String("path", r.URL.Path), slog.String("error", err.Error()))
		writeError(w, http.StatusInternalServerError, "internal", "internal error", "")
	}
}

// decodeBody reads a JSON object into dst, rejecting unknown fields, wrong
// types, trailing data and what [strictjson.Check] refuses with a 4xx naming the
// field. With required false,
// an empty body is accepted as {}.
func decodeBody(w http.ResponseWriter, r *http.Request, dst any, required bool) bool {
	if e := strictjson.ReadBody(w, r, dst, required, maxBody); e != nil {
		writeError(w, e.Status, e.Code, e.Message, e.Field)
		return false
	}
	return true
}

// writeEventTooLarge answers a command whose event the outbox refused as
// too large (outbox.ErrEventTooLarge): 413 with code event_too_large,
// naming the request's field that weighs most in it (its largest value,
// as JSON), which is the one to shorten; none for a command without a
// body.
func writeEventTooLarge(w http.ResponseWriter, in any, err error) {
	var tl *outbox.EventTooLargeError
	_ = errors.As(err, &tl)
	field := largestField(in)
	msg := fmt.Sprintf("the %s event this request would publish is %d bytes, over the limit of %d", tl.EventType, tl.Size, tl.Limit)
	if field != "" {
		msg = field + ": too large: " + msg
	}
	writeError(w, http.StatusRequestEntityTooLarge, "event_too_large", msg, field)
}

// largestField is the JSON name of in's largest field, "" when it has
// none.
func largestField(in any) string {
	b, err := json.Marshal(in)
	if err != nil {
		return ""
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(b, &fields) != nil {
		return ""
	}
	best, size := "", 0
	for k, v := range fields {
		if len(v) > size || (len(v) == size && k < best) {
			best, size = k, len(v)
		}
	}
	return best
}
