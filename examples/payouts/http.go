package payouts

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
)

// Handler serves the payout API:
//
//	POST /payouts                      {"merchant_id", "amount_minor", "currency"} → 201
//	POST /payouts/{id}/sent                                                       → 200
//	POST /payouts/{id}/failed          {"reason"}                                 → 200
//	GET  /merchants/{id}/balances                                                 → 200
//
// A bad request gets a 4xx with a JSON body naming the field and changes
// nothing. A nil logger means slog.Default(). The merchants' webhook routes
// are mounted on the mux returned, behind their API keys, by
// [MountWebhooks].
func (s *Service) Handler(logger *slog.Logger) *http.ServeMux {
	if logger == nil {
		logger = slog.Default()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payouts", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			MerchantID  string `json:"merchant_id"`
			AmountMinor int64  `json:"amount_minor"`
			Currency    string `json:"currency"`
		}
		if !decode(w, r, &in) {
			return
		}
		p, err := s.Request(r.Context(), in.MerchantID, in.AmountMinor, in.Currency)
		reply(w, logger, http.StatusCreated, p, err)
	})
	mux.HandleFunc("POST /payouts/{id}/sent", func(w http.ResponseWriter, r *http.Request) {
		p, err := s.MarkSent(r.Context(), r.PathValue("id"))
		reply(w, logger, http.StatusOK, p, err)
	})
	mux.HandleFunc("POST /payouts/{id}/failed", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Reason string `json:"reason"`
		}
		if !decode(w, r, &in) {
			return
		}
		p, err := s.MarkFailed(r.Context(), r.PathValue("id"), in.Reason)
		reply(w, logger, http.StatusOK, p, err)
	})
	mux.HandleFunc("GET /merchants/{id}/balances", func(w http.ResponseWriter, r *http.Request) {
		b, err := s.Balances(r.Context(), r.PathValue("id"))
		if b == nil {
			b = []Balance{}
		}
		reply(w, logger, http.StatusOK, b, err)
	})
	return mux
}

type errorBody struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			writeJSON(w, http.StatusBadRequest, errorBody{Error: typeErr.Field + ": wrong type", Field: typeErr.Field})
			return false
		}
		writeJSON(w, http.StatusBadRequest, errorBody{Error: "body: " + err.Error(), Field: "body"})
		return false
	}
	return true
}

func reply(w http.ResponseWriter, logger *slog.Logger, status int, v any, err error) {
	var invalid *InvalidError
	switch {
	case err == nil:
		writeJSON(w, status, v)
	case errors.As(err, &invalid):
		writeJSON(w, http.StatusBadRequest, errorBody{Error: invalid.Error(), Field: invalid.Field})
	case errors.Is(err, ErrNotFound):
		writeJSON(w, http.StatusNotFound, errorBody{Error: err.Error(), Field: "id"})
	case errors.Is(err, ErrConflict):
		writeJSON(w, http.StatusConflict, errorBody{Error: err.Error(), Field: "status"})
	default:
		logger.Error("payouts: request failed", "err", err)
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: "internal error"})
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
