package adminapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxBodyBytes bounds every request body (1 MiB): the largest legitimate
// body is a list of ids, far below it.
const maxBodyBytes = 1 << 20

// Page sizes of every list.
const (
	defaultLimit = 100
	maxLimit     = 1000
)

// decodeBody reads r's body as exactly one JSON object into dst, refusing
// unknown fields. optional: an empty body leaves dst as it is.
func decodeBody(w http.ResponseWriter, r *http.Request, dst any, optional bool) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &apiError{Status: http.StatusRequestEntityTooLarge, Field: "body",
				Message: fmt.Sprintf("request body is larger than %d bytes", maxBodyBytes)}
		}
		return badRequest("body", "could not read the request body: "+err.Error())
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		if optional {
			return nil
		}
		return badRequest("body", "request body must be a JSON object")
	}
	if body[0] != '{' {
		return badRequest("body", "request body must be a JSON object")
	}
	if err := checkKeys(body, dst); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return jsonError(err, dst)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return badRequest("body", "request body must hold one JSON object and nothing after it")
	}
	return nil
}

// checkKeys refuses what encoding/json lets through: a key that matches a
// field only case-insensitively ({"URL": …} created a subscription) and a
// key given twice at any depth (the last one silently won, so a proxy or
// audit log reading the first saw another request than the one applied).
// A malformed body is left to the decoder, which says where.
func checkKeys(body []byte, dst any) error {
	known := map[string]bool{}
	for _, name := range strings.Split(knownFields(dst), ", ") {
		known[name] = true
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var walk func(depth int, path string) error
	walk = func(depth int, path string) error {
		tok, err := dec.Token()
		if err != nil {
			return errStop
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return errStop
				}
				key, _ := kt.(string)
				field := key
				if path != "" {
					field = path + "." + key
				}
				if field == "" {
					field = "body" // the empty key: name the body
				}
				if seen[key] {
					return badRequest(field, fmt.Sprintf("%q is given twice; give each field once", key))
				}
				seen[key] = true
				if depth == 0 && !known[key] {
					for k := range known {
						if strings.EqualFold(k, key) {
							return badRequest(key, fmt.Sprintf("is not a field of this request: field names are case-sensitive (did you mean %q?)", k))
						}
					}
				}
				if err := walk(depth+1, field); err != nil {
					return err
				}
			}
			_, _ = dec.Token() // '}'
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if err := walk(depth+1, fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
			_, _ = dec.Token() // ']'
		}
		return nil
	}
	if err := walk(0, ""); err != nil && !errors.Is(err, errStop) {
		return err
	}
	return nil
}

// errStop ends checkKeys on malformed JSON: the decoder reports it.
var errStop = errors.New("malformed JSON")

// jsonError names the field a decoding error is about. encoding/json reports
// an unknown field only in its message; that wording has been stable since
// DisallowUnknownFields appeared (Go 1.10).
func jsonError(err error, dst any) error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return badRequest("body", fmt.Sprintf("malformed JSON at byte %d: %v", syntax.Offset, syntax))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("body", "malformed JSON: the object is not closed")
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		return badRequest(field, fmt.Sprintf("must be %s, not a JSON %s", jsonTypeName(typ.Type), typ.Value))
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name, _ = strconv.Unquote(name)
		if name == "" {
			// {"": …}: still say which part of the request is wrong.
			return badRequest("body", fmt.Sprintf(`the empty key "" is not a field of this request (known fields: %s)`, knownFields(dst)))
		}
		return badRequest(name, fmt.Sprintf("is not a field of this request (known fields: %s)", knownFields(dst)))
	}
	return badRequest("body", "malformed JSON: "+err.Error())
}

func jsonTypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Slice, reflect.Array:
		return "an array of " + strings.TrimPrefix(strings.TrimPrefix(jsonTypeName(t.Elem()), "a "), "an ") + "s"
	case reflect.Pointer:
		return jsonTypeName(t.Elem())
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return t.String()
}

func knownFields(dst any) string {
	t := reflect.TypeOf(dst)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "none: this request takes no body"
	}
	return strings.Join(names, ", ")
}

// query checks r's query string: only the parameters in allowed, each at
// most once, each valid UTF-8 text. A misspelt filter (?subscription_id=
// for ?subscription=) is refused rather than ignored, since ignoring it
// would answer with everything.
func query(r *http.Request, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, badRequest("query", "malformed query string: "+err.Error())
	}
	for k, vs := range q {
		found := false
		for _, a := range allowed {
			found = found || k == a
		}
		if !found {
			if len(allowed) == 0 {
				return nil, badRequest(k, "is not a query parameter of this endpoint (it takes none)")
			}
			return nil, badRequest(k, fmt.Sprintf("is not a query parameter of this endpoint (known: %s)", strings.Join(allowed, ", ")))
		}
		if len(vs) > 1 {
			return nil, badRequest(k, "is given more than once")
		}
		if err := checkText(k, vs[0]); err != nil {
			return nil, err
		}
	}
	return q, nil
}

// checkText refuses what PostgreSQL text cannot store (invalid UTF-8, NUL),
// which would otherwise surface as a database error, not as the client's.
func checkText(field, s string) error {
	if !utf8.ValidString(s) {
		return badRequest(field, "is not valid UTF-8")
	}
	if strings.ContainsRune(s, 0) {
		return badRequest(field, "must not contain NUL characters")
	}
	return nil
}

// parseLimit reads ?limit: default defaultLimit, 1..maxLimit.
func parseLimit(q url.Values) (int, error) {
	s := q.Get("limit")
	if s == "" {
		return defaultLimit, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxLimit {
		return 0, badRequest("limit", fmt.Sprintf("must be an integer between 1 and %d", maxLimit))
	}
	return n, nil
}

// Cursors are opaque to clients: base64url of "<kind>:<position>", the kind
// naming the list the cursor came from, so a cursor of one list handed to
// another is refused instead of silently skipping rows.
const (
	cursorFailed        = "failed"
	cursorSubscriptions = "subscriptions"
	cursorDeliveries    = "deliveries"
)

func encodeCursor(kind, position string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(kind + ":" + position))
}

// decodeCursor returns the position of ?cursor ("" when absent).
func decodeCursor(q url.Values, kind string) (string, error) {
	s := q.Get("cursor")
	if s == "" {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		if pos, ok := strings.CutPrefix(string(raw), kind+":"); ok && pos != "" {
			return pos, nil
		}
	}
	return "", badRequest("cursor", "is not a next_cursor returned by this list")
}

// body starts a handler that takes a JSON body and no query parameter: it
// refuses any parameter, then decodes the body into a T (optional: an empty
// body is the zero T). Every such handler checks its input in this order,
// so one bad request is answered alike by each.
func body[T any](w http.ResponseWriter, r *http.Request, optional bool) (T, error) {
	var req T
	if _, err := query(r); err != nil {
		return req, err
	}
	err := decodeBody(w, r, &req, optional)
	return req, err
}

// pathID starts a handler of one resource, /…/{id}, that takes no query
// parameter: it refuses any parameter, then parses the id with parse.
func pathID[ID any](r *http.Request, parse func(string) (ID, error)) (ID, error) {
	if _, err := query(r); err != nil {
		var zero ID
		return zero, err
	}
	return parse(r.PathValue("id"))
}

// pageQuery starts a list handler: it refuses any query parameter but the
// list's filters, limit and cursor, and reads ?limit= and the position in
// ?cursor= (a next_cursor of a list of this kind, "" when absent).
func pageQuery(r *http.Request, kind string, filters ...string) (q url.Values, limit int, pos string, err error) {
	if q, err = query(r, append(filters, "limit", "cursor")...); err != nil {
		return nil, 0, "", err
	}
	if limit, err = parseLimit(q); err != nil {
		return nil, 0, "", err
	}
	if pos, err = decodeCursor(q, kind); err != nil {
		return nil, 0, "", err
	}
	return q, limit, pos, nil
}
