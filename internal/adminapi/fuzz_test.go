package adminapi

import (
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// FuzzDecodeBody: any request body is decoded or refused with a 4xx
// naming a field, never a panic.
func FuzzDecodeBody(f *testing.F) {
	f.Add(`{"url":"https://x.example/h","event_types":["*"]}`)
	f.Add(`{"URL":"https://x.example/h"}`)
	f.Add(`{"url":"a","url":"b"}`)
	f.Add(`{"ids":[1,2,{"a":{"a":1,"a":2}}]}`)
	f.Add(`{"all_failed":true} trailing`)
	f.Fuzz(func(t *testing.T, body string) {
		var dst subscriptionRequest
		req := httptest.NewRequest("POST", "/api/v1/subscriptions", strings.NewReader(body))
		err := decodeBody(httptest.NewRecorder(), req, &dst, false)
		if err == nil {
			return
		}
		ae, ok := err.(*apiError)
		if !ok || ae.Status < 400 || ae.Status > 499 || ae.Field == "" {
			t.Fatalf("body %q: error %#v is not a 4xx naming a field", body, err)
		}
	})
}

// FuzzCursor: any ?cursor is a position this list issued or a 400 naming
// cursor, never a panic; a cursor this list issued decodes to its position.
func FuzzCursor(f *testing.F) {
	f.Add(encodeCursor(cursorDeliveries, "10234"))
	f.Add(encodeCursor(cursorSubscriptions, "1700000000/abc"))
	f.Add("not base64!")
	f.Add("")
	f.Fuzz(func(t *testing.T, c string) {
		pos, err := decodeCursor(url.Values{"cursor": {c}}, cursorDeliveries)
		if err != nil {
			if ae, ok := err.(*apiError); !ok || ae.Field != "cursor" {
				t.Fatalf("cursor %q: %v", c, err)
			}
			return
		}
		if pos == "" && c != "" {
			t.Fatalf("cursor %q accepted with an empty position", c)
		}
		if pos == "" {
			return // no cursor: the first page
		}
		if again, err := decodeCursor(url.Values{"cursor": {encodeCursor(cursorDeliveries, pos)}}, cursorDeliveries); err != nil || again != pos {
			t.Fatalf("position %q does not survive encode/decode: %q, %v", pos, again, err)
		}
	})
}
