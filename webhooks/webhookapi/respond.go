package webhookapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/outflow-dev/outflow/internal/strictjson"
	"io"
	"net/http"
	"strings"

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
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the body exceeds %d bytes", MaxBody), "")
			return false
		}
		writeError(w, http.StatusBadRequest, "invalid_body", "could not read the body", "")
		return false
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		if required {
			writeError(w, http.StatusBadRequest, "invalid_json", "a JSON object body is required", "")
			return false
		}
		return true
	}
	if err := strictjson.Decode(raw, dst); err != nil {
		writeDecodeError(w, err)
		return false
	}
	return true
}

func writeDecodeError(w http.ResponseWriter, err error) {
	var (
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
		strictErr *strictjson.Error
	)
	switch {
	case errors.As(err, &strictErr):
		writeError(w, http.StatusBadRequest, strictErr.Code, strictErr.Message, strictErr.Field)
	case errors.Is(err, strictjson.ErrTrailingData):
		writeError(w, http.StatusBadRequest, "invalid_json", err.Error(), "")
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		writeError(w, http.StatusBadRequest, "invalid_json", "the body is not valid JSON", "")
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			writeError(w, http.StatusBadRequest, "invalid_json", "the body must be a JSON object", "")
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_type",
			fmt.Sprintf("%s: must be %s, not a JSON %s", field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value), field)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		writeError(w, http.StatusBadRequest, "unknown_field", fmt.Sprintf("%s: unknown field", field), field)
	default:
		writeError(w, http.StatusBadRequest, "invalid_json", "the body is not valid JSON", "")
	}
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int64", "int32":
		return "an integer"
	case "string":
		return "a string"
	case "slice":
		return "an array"
	default:
		return "a " + goKind
	}
}
