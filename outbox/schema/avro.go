package schema

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
)

// The JSON ↔ Avro mapping (docs/contract.md, "Avro subjects"). Payloads are
// stored as JSON; for an AVRO subject the relay writes them as Avro binary
// and the consumer reads them back to the same JSON:
//
//   - null, boolean, string: the JSON value of that type;
//   - int, long: a JSON integer in the type's range; float, double: a JSON
//     number;
//   - bytes, fixed: a base64 string (standard alphabet, padded); a fixed's
//     decoded length must be its size;
//   - enum: the symbol as a string;
//   - array: a JSON array; map: a JSON object;
//   - record: a JSON object with the fields by name; a missing field takes
//     its default (refused with rule "required" when it has none); a member
//     the record does not have is refused (rule "unknown-field"), so nothing
//     in a payload is silently dropped;
//   - union: the plain value (not Avro's {"type": value} wrapping); the first
//     branch, in schema order, that accepts the value is written; JSON null
//     matches the null branch;
//   - logical types: date ⇄ "YYYY-MM-DD"; timestamp-millis and
//     timestamp-micros ⇄ an RFC 3339 string (read back in UTC, fractional
//     seconds only as needed); uuid ⇄ its string; decimal (on bytes or fixed)
//     ⇄ a decimal string such as "12.30" with at most the schema's scale of
//     fractional digits (read back with exactly scale digits). Other logical
//     types (time-millis, time-micros, local-timestamp-*, duration) are
//     written as their underlying type.

// avroCodec is a parsed Avro schema.
type avroCodec struct {
	schema avro.Schema
}

func compileAvro(text string) (*avroCodec, error) {
	// A cache per schema: the package's default cache is keyed by full
	// name, so two versions that define the same record name differently
	// would see each other's definition.
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("avro schema does not parse: %w", err)
	}
	return &avroCodec{schema: s}, nil
}

// avroError is a payload that does not fit the schema: where (JSON pointer)
// and which rule.
type avroError struct {
	path, rule, msg string
}

func (e *avroError) Error() string { return e.path + ": " + e.msg }

func fail(path, rule, format string, args ...any) error {
	return &avroError{path: path, rule: rule, msg: fmt.Sprintf(format, args...)}
}

// encode writes the JSON payload as Avro binary after frame.
func (c *avroCodec) encode(frame, payload []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, &avroError{rule: "json", msg: "payload is not valid JSON: " + err.Error()}
	}
	if dec.More() {
		return nil, &avroError{rule: "json", msg: "payload is not valid JSON: data after the value"}
	}
	var buf bytes.Buffer
	buf.Write(frame)
	w := avro.NewWriter(&buf, 512)
	if err := writeAvro(w, c.schema, v, ""); err != nil {
		return nil, err
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

func pointerToken(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func logicalOf(s avro.Schema) avro.LogicalSchema {
	if l, ok := s.(avro.LogicalTypeSchema); ok {
		return l.Logical()
	}
	return nil
}

func writeAvro(w *avro.Writer, s avro.Schema, v any, path string) error {
	if ref, ok := s.(*avro.RefSchema); ok {
		s = ref.Schema()
	}
	want := func() error {
		return fail(path, "type", "got %s, want %s", typeName(v), s.Type())
	}
	ls := logicalOf(s)
	switch s := s.(type) {
	case *avro.NullSchema:
		if v != nil {
			return want()
		}
		return nil
	case *avro.PrimitiveSchema:
		switch s.Type() {
		case avro.Null:
			if v != nil {
				return want()
			}
		case avro.Boolean:
			b, ok := v.(bool)
			if !ok {
				return want()
			}
			w.WriteBool(b)
		case avro.Int:
			if ls != nil && ls.Type() == avro.Date {
				str, ok := v.(string)
				if !ok {
					return fail(path, "type", "got %s, want a date string YYYY-MM-DD", typeName(v))
				}
				t, err := time.Parse(time.DateOnly, str)
				if err != nil {
					return fail(path, "logical-type", "%q is not a date YYYY-MM-DD", str)
				}
				w.WriteInt(int32(t.Unix() / 86400))
				return nil
			}
			n, err := jsonInt(v, math.MinInt32, math.MaxInt32)
			if err != nil {
				return fail(path, "type", "got %s, want int (%v)", typeName(v), err)
			}
			w.WriteInt(int32(n))
		case avro.Long:
			if ls != nil && (ls.Type() == avro.TimestampMillis || ls.Type() == avro.TimestampMicros) {
				str, ok := v.(string)
				if !ok {
					return fail(path, "type", "got %s, want an RFC 3339 timestamp string", typeName(v))
				}
				t, err := time.Parse(time.RFC3339Nano, str)
				if err != nil {
					return fail(path, "logical-type", "%q is not an RFC 3339 timestamp", str)
				}
				if ls.Type() == avro.TimestampMillis {
					w.WriteLong(t.UnixMilli())
				} else {
					w.WriteLong(t.UnixMicro())
				}
				return nil
			}
			n, err := jsonInt(v, math.MinInt64, math.MaxInt64)
			if err != nil {
				return fail(path, "type", "got %s, want long (%v)", typeName(v), err)
			}
			w.WriteLong(n)
		case avro.Float, avro.Double:
			num, ok := v.(json.Number)
			if !ok {
				return want()
			}
			f, err := num.Float64()
			if err != nil {
				return fail(path, "type", "number %s out of range", num)
			}
			if s.Type() == avro.Float {
				w.WriteFloat(float32(f))
			} else {
				w.WriteDouble(f)
			}
		case avro.String:
			str, ok := v.(string)
			if !ok {
				return want()
			}
			w.WriteString(str)
		case avro.Bytes:
			if d, ok := ls.(*avro.DecimalLogicalSchema); ok {
				b, err := decimalBytes(v, d, path)
				if err != nil {
					return err
				}
				w.WriteBytes(b)
				return nil
			}
			b, err := base64Bytes(v, path)
			if err != nil {
				return err
			}
			w.WriteBytes(b)
		default:
			return fail(path, "schema-type", "unsupported Avro type %s", s.Type())
		}
		return nil
	case *avro.FixedSchema:
		var b []byte
		var err error
		if d, ok := s.Logical().(*avro.DecimalLogicalSchema); ok {
			b, err = decimalBytes(v, d, path)
			if err == nil && len(b) <= s.Size() {
				// Sign-extend to the fixed size (two's complement).
				pad := byte(0)
				if len(b) > 0 && b[0]&0x80 != 0 {
					pad = 0xff
				}
				b = append(bytes.Repeat([]byte{pad}, s.Size()-len(b)), b...)
			}
		} else {
			b, err = base64Bytes(v, path)
		}
		if err != nil {
			return err
		}
		if len(b) != s.Size() {
			return fail(path, "size", "%d bytes, fixed %s has %d", len(b), s.FullName(), s.Size())
		}
		_, _ = w.Write(b)
		return nil
	case *avro.EnumSchema:
		str, ok := v.(string)
		if !ok {
			return fail(path, "type", "got %s, want a symbol of enum %s", typeName(v), s.FullName())
		}
		for i, sym := range s.Symbols() {
			if sym == str {
				w.WriteInt(int32(i))
				return nil
			}
		}
		return fail(path, "enum", "%q is not a symbol of %s (%s)", str, s.FullName(), strings.Join(s.Symbols(), ", "))
	case *avro.ArraySchema:
		arr, ok := v.([]any)
		if !ok {
			return want()
		}
		if len(arr) > 0 {
			w.WriteLong(int64(len(arr)))
			for i, item := range arr {
				if err := writeAvro(w, s.Items(), item, path+"/"+strconv.Itoa(i)); err != nil {
					return err
				}
			}
		}
		w.WriteLong(0)
		return nil
	case *avro.MapSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return want()
		}
		if len(obj) > 0 {
			w.WriteLong(int64(len(obj)))
			for k, item := range obj {
				w.WriteString(k)
				if err := writeAvro(w, s.Values(), item, path+"/"+pointerToken(k)); err != nil {
					return err
				}
			}
		}
		w.WriteLong(0)
		return nil
	case *avro.RecordSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return fail(path, "type", "got %s, want record %s (an object)", typeName(v), s.FullName())
		}
		fields := make(map[string]bool, len(s.Fields()))
		for _, f := range s.Fields() {
			fields[f.Name()] = true
		}
		for k := range obj {
			if !fields[k] {
				return fail(path+"/"+pointerToken(k), "unknown-field", "record %s has no field %q", s.FullName(), k)
			}
		}
		for _, f := range s.Fields() {
			fp := path + "/" + pointerToken(f.Name())
			fv, ok := obj[f.Name()]
			if !ok {
				if !f.HasDefault() {
					return fail(fp, "required", "field %q of record %s is missing and has no default", f.Name(), s.FullName())
				}
				if err := writeDefault(w, f, fp); err != nil {
					return err
				}
				continue
			}
			if err := writeAvro(w, f.Type(), fv, fp); err != nil {
				return err
			}
		}
		return nil
	case *avro.UnionSchema:
		var first error
		for i, branch := range s.Types() {
			var tmp bytes.Buffer
			bw := avro.NewWriter(&tmp, 64)
			err := writeAvro(bw, branch, v, path)
			if err == nil {
				if err = bw.Flush(); err == nil {
					w.WriteLong(int64(i))
					_, _ = w.Write(tmp.Bytes())
					return nil
				}
			}
			if first == nil {
				first = err
			}
		}
		names := make([]string, 0, len(s.Types()))
		for _, b := range s.Types() {
			names = append(names, unionBranchName(b))
		}
		var ae *avroError
		if errors.As(first, &ae) && ae.path != path {
			// The value had the shape of a branch but a member is wrong:
			// name that member.
			return first
		}
		return fail(path, "union", "got %s, which fits none of %s", typeName(v), strings.Join(names, ", "))
	}
	return fail(path, "schema-type", "unsupported Avro type %s", s.Type())
}

func unionBranchName(s avro.Schema) string {
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	return string(s.Type())
}

// writeDefault writes field f's default, read as JSON through the same
// mapping (the default of a union field is of its first branch).
func writeDefault(w *avro.Writer, f *avro.Field, path string) error {
	b, err := json.Marshal(f.Default())
	if err != nil {
		return fail(path, "default", "default of %q: %v", f.Name(), err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fail(path, "default", "default of %q: %v", f.Name(), err)
	}
	s := f.Type()
	if u, ok := s.(*avro.UnionSchema); ok {
		w.WriteLong(0)
		s = u.Types()[0]
	}
	return writeAvro(w, s, v, path)
}

func jsonInt(v any, lo, hi int64) (int64, error) {
	num, ok := v.(json.Number)
	if !ok {
		return 0, errors.New("not a number")
	}
	n, err := strconv.ParseInt(num.String(), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s is not an integer in range", num)
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("%s is out of range", num)
	}
	return n, nil
}

func base64Bytes(v any, path string) ([]byte, error) {
	str, ok := v.(string)
	if !ok {
		return nil, fail(path, "type", "got %s, want a base64 string", typeName(v))
	}
	b, err := base64.StdEncoding.DecodeString(str)
	if err != nil {
		return nil, fail(path, "base64", "not base64: %v", err)
	}
	return b, nil
}

// decimalBytes is the big-endian two's-complement unscaled value of the
// decimal string v.
func decimalBytes(v any, d *avro.DecimalLogicalSchema, path string) ([]byte, error) {
	str, ok := v.(string)
	if !ok {
		return nil, fail(path, "type", "got %s, want a decimal string", typeName(v))
	}
	r, ok := new(big.Rat).SetString(str)
	if !ok || strings.ContainsAny(str, "/eE") {
		return nil, fail(path, "logical-type", "%q is not a decimal number", str)
	}
	scaled := new(big.Rat).Mul(r, new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d.Scale())), nil)))
	if !scaled.IsInt() {
		return nil, fail(path, "logical-type", "%q has more than %d fractional digits", str, d.Scale())
	}
	n := scaled.Num()
	if d.Precision() > 0 && len(new(big.Int).Abs(n).String()) > d.Precision() {
		return nil, fail(path, "logical-type", "%q has more than %d digits", str, d.Precision())
	}
	return twosComplement(n), nil
}

func twosComplement(n *big.Int) []byte {
	if n.Sign() >= 0 {
		b := n.Bytes()
		if len(b) == 0 || b[0]&0x80 != 0 {
			b = append([]byte{0}, b...)
		}
		return b
	}
	// -n = 2^k - |n| for the smallest k (a multiple of 8) that holds it.
	k := (n.BitLen()/8 + 1) * 8
	m := new(big.Int).Add(new(big.Int).Lsh(big.NewInt(1), uint(k)), n)
	b := m.Bytes()
	for len(b) < k/8 {
		b = append([]byte{0xff}, b...)
	}
	return b
}

func fromTwosComplement(b []byte) *big.Int {
	n := new(big.Int).SetBytes(b)
	if len(b) > 0 && b[0]&0x80 != 0 {
		n.Sub(n, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	return n
}

// decode reads the Avro binary data (after the framing) back to the JSON
// the payload was.
func (c *avroCodec) decode(data []byte) ([]byte, error) {
	r := avro.NewReader(bytes.NewReader(data), len(data)+1)
	var buf bytes.Buffer
	if err := readAvro(r, c.schema, &buf); err != nil {
		return nil, err
	}
	if r.Error != nil {
		return nil, fmt.Errorf("avro value: %w", r.Error)
	}
	return buf.Bytes(), nil
}

func writeJSON(buf *bytes.Buffer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf.Write(b)
	return nil
}

func readAvro(r *avro.Reader, s avro.Schema, buf *bytes.Buffer) error {
	if ref, ok := s.(*avro.RefSchema); ok {
		s = ref.Schema()
	}
	if r.Error != nil {
		return fmt.Errorf("avro value: %w", r.Error)
	}
	ls := logicalOf(s)
	switch s := s.(type) {
	case *avro.NullSchema:
		buf.WriteString("null")
		return nil
	case *avro.PrimitiveSchema:
		switch s.Type() {
		case avro.Null:
			buf.WriteString("null")
		case avro.Boolean:
			return writeJSON(buf, r.ReadBool())
		case avro.Int:
			n := r.ReadInt()
			if ls != nil && ls.Type() == avro.Date {
				return writeJSON(buf, time.Unix(int64(n)*86400, 0).UTC().Format(time.DateOnly))
			}
			return writeJSON(buf, n)
		case avro.Long:
			n := r.ReadLong()
			if ls != nil && ls.Type() == avro.TimestampMillis {
				return writeJSON(buf, time.UnixMilli(n).UTC().Format(time.RFC3339Nano))
			}
			if ls != nil && ls.Type() == avro.TimestampMicros {
				return writeJSON(buf, time.UnixMicro(n).UTC().Format(time.RFC3339Nano))
			}
			return writeJSON(buf, n)
		case avro.Float:
			return writeJSON(buf, r.ReadFloat())
		case avro.Double:
			return writeJSON(buf, r.ReadDouble())
		case avro.String:
			return writeJSON(buf, r.ReadString())
		case avro.Bytes:
			b := r.ReadBytes()
			if d, ok := ls.(*avro.DecimalLogicalSchema); ok {
				return writeJSON(buf, decimalString(b, d))
			}
			return writeJSON(buf, base64.StdEncoding.EncodeToString(b))
		default:
			return fmt.Errorf("unsupported Avro type %s", s.Type())
		}
		return nil
	case *avro.FixedSchema:
		b := make([]byte, s.Size())
		r.Read(b)
		if d, ok := s.Logical().(*avro.DecimalLogicalSchema); ok {
			return writeJSON(buf, decimalString(b, d))
		}
		return writeJSON(buf, base64.StdEncoding.EncodeToString(b))
	case *avro.EnumSchema:
		i := r.ReadInt()
		sym, ok := s.Symbol(int(i))
		if !ok {
			return fmt.Errorf("avro value: enum %s has no symbol %d", s.FullName(), i)
		}
		return writeJSON(buf, sym)
	case *avro.ArraySchema:
		buf.WriteByte('[')
		first := true
		for {
			n, _ := r.ReadBlockHeader()
			if n == 0 || r.Error != nil {
				break
			}
			for ; n > 0; n-- {
				if !first {
					buf.WriteByte(',')
				}
				first = false
				if err := readAvro(r, s.Items(), buf); err != nil {
					return err
				}
			}
		}
		buf.WriteByte(']')
		return nil
	case *avro.MapSchema:
		buf.WriteByte('{')
		first := true
		for {
			n, _ := r.ReadBlockHeader()
			if n == 0 || r.Error != nil {
				break
			}
			for ; n > 0; n-- {
				if !first {
					buf.WriteByte(',')
				}
				first = false
				if err := writeJSON(buf, r.ReadString()); err != nil {
					return err
				}
				buf.WriteByte(':')
				if err := readAvro(r, s.Values(), buf); err != nil {
					return err
				}
			}
		}
		buf.WriteByte('}')
		return nil
	case *avro.RecordSchema:
		buf.WriteByte('{')
		for i, f := range s.Fields() {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeJSON(buf, f.Name()); err != nil {
				return err
			}
			buf.WriteByte(':')
			if err := readAvro(r, f.Type(), buf); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
		return nil
	case *avro.UnionSchema:
		i := r.ReadLong()
		types := s.Types()
		if i < 0 || int(i) >= len(types) {
			return fmt.Errorf("avro value: union branch %d of %d", i, len(types))
		}
		return readAvro(r, types[i], buf)
	}
	return fmt.Errorf("unsupported Avro type %s", s.Type())
}

func decimalString(b []byte, d *avro.DecimalLogicalSchema) string {
	n := fromTwosComplement(b)
	return new(big.Rat).SetFrac(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d.Scale())), nil)).FloatString(d.Scale())
}
