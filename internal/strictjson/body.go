package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// BodyError is a refused request body: the HTTP status to answer, the API
// error code, its message and the field at fault ("" when none).
type BodyError struct {
	Status               int
	Code, Message, Field string
}

// ReadBody reads r's body, at most max bytes, as a JSON object into dst,
// refusing unknown fields, wrong types, trailing data and what [Check]
// refuses. With required false, an empty body is accepted as {}. It
// returns nil when dst was filled; the caller writes the error in its own
// response shape.
func ReadBody(w http.ResponseWriter, r *http.Request, dst any, required bool, max int64) *BodyError {
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &BodyError{http.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the body exceeds %d bytes", max), ""}
		}
		return &BodyError{http.StatusBadRequest, "invalid_body", "could not read the body", ""}
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		if required {
			return &BodyError{http.StatusBadRequest, "invalid_json", "a JSON object body is required", ""}
		}
		return nil
	}
	if err := Decode(raw, dst); err != nil {
		return DecodeError(err)
	}
	return nil
}

// DecodeError says why [Decode] refused a body, naming the field.
func DecodeError(err error) *BodyError {
	var (
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
		strictErr *Error
	)
	bad := func(code, msg, field string) *BodyError { return &BodyError{http.StatusBadRequest, code, msg, field} }
	switch {
	case errors.As(err, &strictErr):
		return bad(strictErr.Code, strictErr.Message, strictErr.Field)
	case errors.Is(err, ErrTrailingData):
		return bad("invalid_json", err.Error(), "")
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		return bad("invalid_json", "the body is not valid JSON", "")
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return bad("invalid_json", "the body must be a JSON object", "")
		}
		return bad("invalid_type", fmt.Sprintf("%s: must be %s, not a JSON %s", field, jsonKind(typeErr.Type.Kind().String()), typeErr.Value), field)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return bad("unknown_field", fmt.Sprintf("%s: unknown field", field), field)
	default:
		return bad("invalid_json", "the body is not valid JSON", "")
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
