package cli_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outflow-dev/outflow/app/apikey"
	appmigrations "github.com/outflow-dev/outflow/app/migrations"
	"github.com/outflow-dev/outflow/outflowtest"
)

// `outflow console --addr` replaces the address --console-insecure-cookie
// was checked against: a non-loopback one is refused there too, before
// anything listens.
func TestConsoleAddrKeepsTheCookieSecure(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	cmd := command(map[string]string{"DATABASE_URL": s.URL, "CONSOLE_INSECURE_COOKIE": "true"},
		"console", "--addr", "0.0.0.0:0")
	var out outflowtest.LogBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		require.Error(t, err, "%s", out.String())
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the console started on a non-loopback address with an insecure cookie: %s", out.String())
	}
	require.Contains(t, out.String(), "invalid --addr")
	require.Contains(t, out.String(), "console-insecure-cookie")
}

// `serve --roles api,console` serves the console on --console-addr, apart
// from the API; an admin key logs in, and the cookie is Secure unless
// --console-insecure-cookie.
func TestServeConsoleRole(t *testing.T) {
	t.Parallel()
	s := outflowtest.NewSchema(t, appmigrations.Sets()...)
	key, err := apikey.Create(context.Background(), s.Pool, apikey.New{Name: "ops"})
	require.NoError(t, err)
	for _, insecure := range []bool{false, true} {
		api, consoleAddr := freeAddr(t), freeAddr(t)
		env := map[string]string{"DATABASE_URL": s.URL, "HTTP_ADDR": api, "CONSOLE_ADDR": consoleAddr}
		if insecure {
			env["CONSOLE_INSECURE_COOKIE"] = "true"
		}
		cmd := command(env, "serve", "--roles", "api,console")
		var stderr outflowtest.LogBuffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill() })

		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		listens := func(url string) func() bool {
			return func() bool {
				resp, err := client.Get(url)
				if err == nil {
					resp.Body.Close()
				}
				return err == nil
			}
		}
		outflowtest.WaitFor(t, 20*time.Second, "the console to listen", listens("http://"+consoleAddr+"/"))
		resp, err := client.Get("http://" + consoleAddr + "/")
		require.NoError(t, err, stderr.String())
		resp.Body.Close()
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		require.Equal(t, "/login", resp.Header.Get("Location"))
		// The api role may listen after the console: wait for it before
		// asking it for the console's page.
		outflowtest.WaitFor(t, 20*time.Second, "the API to listen", listens("http://"+api+"/healthz"))
		resp, err = client.Get("http://" + api + "/login")
		require.NoError(t, err)
		resp.Body.Close()
		require.NotEqual(t, http.StatusOK, resp.StatusCode, "the API's address does not serve the console")

		resp, err = client.PostForm("http://"+consoleAddr+"/login", url.Values{"api_key": {key.Secret}})
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
		setCookie := resp.Header.Get("Set-Cookie")
		require.Contains(t, setCookie, "HttpOnly")
		require.Contains(t, setCookie, "SameSite=Strict")
		require.Equal(t, !insecure, strings.Contains(setCookie, "Secure"), setCookie)
		require.NotContains(t, stderr.String(), key.Secret, "the key is never logged")

		// The first overview has a published rate, not n/a: the role takes the
		// rate's first sample before the console listens (then Run samples on).
		req, err := http.NewRequest(http.MethodGet, "http://"+consoleAddr+"/", nil)
		require.NoError(t, err)
		req.Header.Set("Cookie", strings.SplitN(setCookie, ";", 2)[0])
		resp, err = client.Do(req)
		require.NoError(t, err)
		page, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Regexp(t, `id="outbox-rate">[0-9]+\.[0-9]/s<`, string(page))

		// The search offers the app's event types, though the outbox
		// holds none of them yet: the role gives the console its registry.
		req, err = http.NewRequest(http.MethodGet, "http://"+consoleAddr+"/search", nil)
		require.NoError(t, err)
		req.Header.Set("Cookie", strings.SplitN(setCookie, ";", 2)[0])
		resp, err = client.Do(req)
		require.NoError(t, err)
		page, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Regexp(t, `(?s)id="search-event-type">.*<option value="payment.refunded"`, string(page))

		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		require.NoError(t, cmd.Wait(), stderr.String())
	}
}
