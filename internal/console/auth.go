package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/outflow-dev/outflow/app/apikey"
)

// CookieName is the session cookie's name.
const CookieName = "outflow_console"

// CSRFField is the hidden field every POST form carries.
const CSRFField = "csrf_token"

// maxForm bounds a POST body: a selection of ids, never more.
const maxForm = 1 << 20

// session is a logged-in operator.
type session struct {
	token   string // the cookie's value; never logged
	keyID   string
	keyName string
}

// csrf is the session's CSRF token: derived from the session token, so it
// needs no storage, and unguessable without the cookie.
func (s session) csrf() string {
	sum := sha256.Sum256([]byte("outflow-console-csrf:" + s.token))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

func tokenHash(token string) []byte {
	sum := sha256.Sum256([]byte(token))
	return sum[:]
}

// authed wraps a handler that needs a session: without one, a page
// redirects to /login, with next= the page asked for, and a POST is
// refused. A POST must carry the session's CSRF token.
func (c *Console) authed(h func(http.ResponseWriter, *http.Request, session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, ok, err := c.session(r.Context(), r)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		if !ok {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, loginURL(r), http.StatusSeeOther)
				return
			}
			http.Error(w, "not logged in", http.StatusForbidden)
			return
		}
		if r.Method == http.MethodPost {
			got := r.PostFormValue(CSRFField) // parsed and bounded by readParams
			if subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf())) != 1 {
				c.log.Warn("console: POST refused: missing or wrong CSRF token", "path", r.URL.Path, "api_key_id", s.keyID)
				http.Error(w, "missing or wrong CSRF token", http.StatusForbidden)
				return
			}
		}
		h(w, r, s)
	}
}

// session finds the request's live session: not expired, and its key
// still a live admin key (revoking the key ends its sessions at once).
func (c *Console) session(ctx context.Context, r *http.Request) (session, bool, error) {
	ck, err := r.Cookie(CookieName)
	if err != nil || ck.Value == "" || len(ck.Value) > 128 {
		return session{}, false, nil
	}
	s := session{token: ck.Value}
	if c.sessions != nil {
		if !c.sessions.live(s.token, c.now()) {
			return session{}, false, nil
		}
		s.keyID, s.keyName = operatorKeyID, operatorKeyName
		return s, true, nil
	}
	err = c.cfg.Pool.QueryRow(ctx, `
		SELECT k.id::text, k.name FROM console_sessions s JOIN api_keys k ON k.id = s.api_key_id
		WHERE s.token_hash = $1 AND s.expires_at > now() AND k.revoked_at IS NULL AND k.merchant_id IS NULL`,
		tokenHash(s.token)).Scan(&s.keyID, &s.keyName)
	if errors.Is(err, pgx.ErrNoRows) {
		return session{}, false, nil
	}
	if err != nil {
		return session{}, false, fmt.Errorf("read console session: %w", err)
	}
	return s, true, nil
}

// NextField is the login form's field (and the login page's query
// parameter) naming the page to return to once logged in.
const NextField = "next"

// maxNext bounds the page a login returns to: a pasted link, not a payload.
const maxNext = 2048

// loginURL is the login page for a request without a session: it returns
// to the page asked for, but for the overview (where a login goes anyway)
// and a fragment, which a page's script fetches and a person never opens.
func loginURL(r *http.Request) string {
	next := r.URL.RequestURI()
	if next == "/" || strings.HasPrefix(r.URL.Path, "/fragments/") || localPath(next) == "/" {
		return "/login"
	}
	return "/login?" + NextField + "=" + url.QueryEscape(next)
}

// localPath is next when it is a path of this console, "/" otherwise: a
// login must not send the browser to another site (an open redirect turns
// the console's login page into a phishing link's alibi). Accepted: an
// absolute path with its query, nothing a browser could read as a host.
// Refused: a scheme, a host, a scheme-relative "//host", a backslash
// (browsers read "/\host" as "//host"), control characters and spaces
// (browsers drop tabs and newlines from a URL, which could join "/" and a
// following "/"), the login page itself, and anything over maxNext bytes.
func localPath(next string) string {
	if next == "" || len(next) > maxNext || next[0] != '/' || strings.HasPrefix(next, "//") {
		return "/"
	}
	for _, r := range next {
		if r == '\\' || r <= ' ' || r == 0x7f || !unicode.IsPrint(r) {
			return "/"
		}
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" ||
		!strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") || u.Path == "/login" {
		return "/"
	}
	return next
}

// loginData is what the login page's form carries: the page to return to.
type loginData struct{ Next string }

func loginPageOf(r *http.Request, errText string) page {
	next := localPath(r.FormValue(NextField)) // the query's on a GET, the form's on a POST
	if next == "/" {
		next = ""
	}
	return page{Title: "Log in", Error: errText, Data: loginData{Next: next}}
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, http.StatusOK, "login", loginPageOf(r, ""))
}

// login opens a session for a live admin API key. The key is never logged
// nor echoed; a wrong key and a merchant's key get the same answer. Failed
// logins are throttled (see loginThrottle): while an address or a key
// prefix is, its logins are refused with a 429 and Retry-After, a right
// key's too, before the key is looked at.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	secret := strings.TrimSpace(r.PostFormValue("api_key")) // parsed and bounded by readParams
	ctx := r.Context()
	keys := loginKeys(r, secret)
	if wait := c.logins.wait(c.now(), keys); wait > 0 {
		w.Header().Set("Retry-After", retryAfter(wait))
		c.log.Warn("console: login throttled", "remote", r.RemoteAddr, "retry_after", retryAfter(wait))
		c.render(w, http.StatusTooManyRequests, "login", loginPageOf(r,
			"Too many failed logins: try again in "+retryAfter(wait)+" s."))
		return
	}
	if c.sessions != nil {
		c.operatorLogin(w, r, secret, keys)
		return
	}
	k, ok, err := apikey.Authenticate(ctx, c.cfg.Pool, secret)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if !ok || !k.Admin() {
		c.refuseLogin(w, r, keys, "That is not a live admin API key.")
		return
	}
	c.logins.reset(keys)
	token, err := newToken()
	if err != nil {
		c.fail(w, r, err)
		return
	}
	err = pgx.BeginFunc(ctx, c.cfg.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM console_sessions WHERE expires_at < now()`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO console_sessions (token_hash, api_key_id, expires_at)
			VALUES ($1, $2, now() + make_interval(secs => $3))`, tokenHash(token), k.ID, c.cfg.SessionTTL.Seconds())
		return err
	})
	if err != nil {
		c.fail(w, r, fmt.Errorf("store console session: %w", err))
		return
	}
	if err := apikey.Touch(ctx, c.cfg.Pool, k); err != nil {
		c.log.Warn("console: record key use", "error", err.Error())
	}
	c.log.Info("console: login", "api_key_id", k.ID, "api_key_name", k.Name)
	c.startSession(w, r, token)
}

// operatorLogin is a FrameworkOnly console's login: the operator key, a
// session in memory. Refused and throttled as an API key's login is.
func (c *Console) operatorLogin(w http.ResponseWriter, r *http.Request, secret string, keys []string) {
	if !c.operatorKey(secret) {
		c.refuseLogin(w, r, keys, "That is not the operator key.")
		return
	}
	c.logins.reset(keys)
	token, err := newToken()
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.sessions.open(token, c.now(), c.cfg.SessionTTL)
	c.log.Info("console: login", "api_key_id", operatorKeyID, "api_key_name", operatorKeyName)
	c.startSession(w, r, token)
}

func (c *Console) refuseLogin(w http.ResponseWriter, r *http.Request, keys []string, msg string) {
	c.logins.fail(c.now(), keys)
	c.log.Warn("console: login refused", "remote", r.RemoteAddr)
	c.render(w, http.StatusUnauthorized, "login", loginPageOf(r, msg))
}

func newToken() (string, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("session token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(raw), nil
}

// startSession gives the browser the session's cookie and sends it to the
// page the login form names (next), when it is a local one, else to the
// overview.
func (c *Console) startSession(w http.ResponseWriter, r *http.Request, token string) {
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: token, Path: "/", MaxAge: int(c.cfg.SessionTTL.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: !c.cfg.InsecureCookie,
	})
	http.Redirect(w, r, localPath(r.PostFormValue(NextField)), http.StatusSeeOther)
}

// logout ends the session, and records it in the audit with it.
// A FrameworkOnly console's session, in memory, ends without the database:
// nothing the database does (down, its pool closed) can leave it live, and
// its record is the log line, as for every action of such a console.
func (c *Console) logout(w http.ResponseWriter, r *http.Request, s session) {
	if c.sessions != nil {
		var n int64
		if c.sessions.close(s.token) {
			n = 1
		}
		c.log.Info("console: action", "action", "logout", "api_key_id", s.keyID, "target", "{}", "rows", n)
		c.endSession(w, r)
		return
	}
	_, doErr, err := c.inTx(r.Context(), s, "logout", struct{}{}, func(ctx context.Context, tx pgx.Tx) (int64, error) {
		tag, err := tx.Exec(ctx, `DELETE FROM console_sessions WHERE token_hash = $1`, tokenHash(s.token))
		if err != nil {
			return 0, fmt.Errorf("delete console session: %w", err)
		}
		return tag.RowsAffected(), nil
	})
	if err == nil {
		err = doErr
	}
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.endSession(w, r)
}

// endSession clears the browser's session cookie and sends it to the login.
func (c *Console) endSession(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: !c.cfg.InsecureCookie})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

func (c *Console) pageFor(s session, title string) page {
	return page{Title: title, CSRF: s.csrf(), KeyName: s.keyName}
}
