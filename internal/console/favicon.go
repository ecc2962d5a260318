package console

import (
	"bytes"
	"encoding/binary"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"sync"
)

// favicon is /favicon.ico: a 32×32 icon (the console's blue with a white
// arrow, the outbox's "out"), drawn here so that there is no binary to keep
// in the tree. Browsers ask every site for /favicon.ico; without an answer
// each page a browser opens adds a 404 to the ops server's log.
var favicon = sync.OnceValue(func() []byte {
	const n = 32
	img := image.NewNRGBA(image.Rect(0, 0, n, n))
	blue := color.NRGBA{0x24, 0x51, 0xb7, 0xff}
	white := color.NRGBA{0xff, 0xff, 0xff, 0xff}
	for y := 0; y < n; y++ {
		for x := 0; x < n; x++ {
			c := blue
			// An arrow pointing right: a shaft and a head.
			if (y >= 14 && y <= 17 && x >= 6 && x <= 20) || (x >= 18 && x <= 26 && abs(float64(y)-15.5) <= float64(26-x)) {
				c = white
			}
			img.SetNRGBA(x, y, c)
		}
	}
	var p bytes.Buffer
	_ = png.Encode(&p, img)
	// ICO: a 6-byte header and one 16-byte directory entry pointing at the
	// PNG (ICO files may hold PNG images).
	var b bytes.Buffer
	_ = binary.Write(&b, binary.LittleEndian, [3]uint16{0, 1, 1})
	b.Write([]byte{n, n, 0, 0})
	_ = binary.Write(&b, binary.LittleEndian, [2]uint16{1, 32})
	_ = binary.Write(&b, binary.LittleEndian, [2]uint32{uint32(p.Len()), 6 + 16})
	b.Write(p.Bytes())
	return b.Bytes()
})

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

func serveFavicon(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "image/x-icon")
	w.Header().Set("Cache-Control", "public, max-age=86400")
	_, _ = w.Write(favicon())
}
