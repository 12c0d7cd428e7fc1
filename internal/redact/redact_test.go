package redact_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/outflow-dev/outflow/internal/redact"
)

func TestURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"},
		{"amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"postgres://u:secret@db/x?sslmode=disable", "postgres://u:xxxxx@db/x?sslmode=disable"},
		{"postgres://u@db/x?password=secret", "postgres://u@db/x?password=xxxxx"},
		{"postgres://u@db/x?PassWord=a&sslpassword=b&sslmode=require&sslkey=/k.pem", "postgres://u@db/x?PassWord=xxxxx&sslkey=%2Fk.pem&sslmode=require&sslpassword=xxxxx"},
		{"redis://h/0?token=t&api_key=k&Secret=s&passwd=p&key=k2&access_token=a", "redis://h/0?Secret=xxxxx&access_token=xxxxx&api_key=xxxxx&key=xxxxx&passwd=xxxxx&token=xxxxx"},
		{"nats://user@h:4222", "nats://xxxxx@h:4222"}, // a NATS token
		{"nats://user:pw@h:4222", "nats://user:xxxxx@h:4222"},
		{"redis://user@h:1", "redis://user@h:1"},
		{"redis://:pw@h:1", "redis://:xxxxx@h:1"},
		{"postgres://u:p@[::1", "(unparseable URL)"},
		{"postgres://h/x?password=a%zz", "postgres://h/x?(unparseable query)"},
	} {
		if got := redact.URL(tc.in); got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestSecretsAndText(t *testing.T) {
	for _, tc := range []struct {
		conn string
		msg  string
	}{
		{"postgres://u:Pw1secret@h/x?password=Qp1secret", "cannot parse postgres://u:Pw1secret@h/x?password=Qp1secret"},
		{"postgres://u:Pw1secret@[::1/x?password=Qp1secret&token=Tk1secret", "bad `postgres://u:xxxxx@[::1/x?password=xxxxx&token=Tk1secret`"},
		{"host=h user=u password='Pw1secret' sslpassword=Qp1secret", "dsn host=h password=Pw1secret sslpassword=Qp1secret"},
		{"user:Pw1secret@h:9092,h2:9092", `want host:port: "user:Pw1secret@h:9092"`},
		{"nats://Tk1secret@h:4222", "connect to nats://Tk1secret@h:4222"},
		{"redis://:Pw%2F1secret@h/0", "auth Pw/1secret failed, Pw%2F1secret"},
	} {
		got := redact.Text(tc.msg, tc.conn)
		for _, sec := range []string{"Pw1secret", "Qp1secret", "Tk1secret", "Pw/1secret", "Pw%2F1secret"} {
			if strings.Contains(got, sec) {
				t.Errorf("Text(%q, %q) = %q: holds %q", tc.msg, tc.conn, got, sec)
			}
		}
	}
	if got := redact.DSN("host=h password=p sslmode=disable"); got != "host=h password=xxxxx sslmode=disable" {
		t.Errorf("DSN: %q", got)
	}
}

func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	conn := "postgres://u:Pw1secret@h/x"
	log := slog.New(redact.Handler(slog.NewTextHandler(&buf, nil), conn)).With("url", conn)
	log.Info("cannot reach "+conn, "error", errors.New("dial "+conn), "group", slog.GroupValue(slog.String("u", conn)),
		"list", []string{conn}, "n", 1)
	if strings.Contains(buf.String(), "Pw1secret") || !strings.Contains(buf.String(), "n=1") {
		t.Errorf("log: %s", buf.String())
	}
}

func ExampleURL() {
	fmt.Println(redact.URL("postgres://app:hunter2@db:5432/pay?sslmode=require&sslpassword=k3y"))
	// Output: postgres://app:xxxxx@db:5432/pay?sslmode=require&sslpassword=xxxxx
}
