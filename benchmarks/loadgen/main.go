// The gateway benchmark's scripted upstream and load generator, compiled so
// that on a small machine their own CPU leaves the gateway room to measure.
//
//	loadgen upstream PORT INTERVAL_MS     serve a Messages event stream of 24 events
//	loadgen load URL CONCURRENCY COUNT [anonymous|large=MB]
//	                                       send COUNT streaming requests, CONCURRENCY at a time
//	                                       (anonymous: without the session header, which a gateway
//	                                       forwards without attesting; large=MB: meanwhile one
//	                                       request of MB MiB after another, not measured)
//
// Every request shows the benchmark's fleet credential (x-dsh-gateway-credential).
//
// load first sends one request on each of its CONCURRENCY connections, not
// measured: a connection's set-up (TCP, the first request through each
// layer) is paid once per agent, not per request. It then prints one JSON
// object: requests per second and the p50/p99 time to the first body byte
// and to the last, in milliseconds.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

const events = 24

var body = []byte(`{"model":"deepseek-v4-flash","max_tokens":1024,"stream":true,"system":"Be brief.",` +
	`"messages":[{"role":"user","content":[{"type":"text","text":"Say something."}]}]}`)

// Credential is the benchmark's fleet credential (benchmarks/gateway.py gives the gateway the same).
const Credential = "benchmark-fleet-credential"

// largeBody is a valid Messages request of about megabytes MiB: a long history of short turns.
func largeBody(megabytes int) []byte {
	var buffer bytes.Buffer
	buffer.WriteString(`{"model":"deepseek-v4-flash","max_tokens":1024,"stream":true,"system":"Be brief.","messages":[`)
	for turn := 0; buffer.Len() < megabytes<<20; turn++ {
		if turn > 0 {
			buffer.WriteString(",")
		}
		fmt.Fprintf(&buffer, `{"role":"user","content":[{"type":"text","text":"Question %d: what comes next?"}]},`+
			`{"role":"assistant","content":[{"type":"text","text":"Answer %d: the next one, as before."}]}`, turn, turn)
	}
	buffer.WriteString(`,{"role":"user","content":[{"type":"text","text":"Say something."}]}]}`)
	return buffer.Bytes()
}

func upstream(port string, interval time.Duration) {
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("content-type", "text/event-stream")
		flusher := w.(http.Flusher)
		for i := 0; i < events; i++ {
			if i > 0 && interval > 0 {
				time.Sleep(interval) // the model's pace
			}
			fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"+
				"\"delta\":{\"type\":\"text_delta\",\"text\":\"token %d \"}}\n\n", i)
			flusher.Flush()
		}
	})
	if err := http.ListenAndServe("127.0.0.1:"+port, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func one(client *http.Client, url string, session string, payload []byte) (float64, float64, error) {
	request, _ := http.NewRequest("POST", url, bytes.NewReader(payload))
	request.Header.Set("content-type", "application/json")
	if session != "" {
		request.Header.Set("x-deepseek-harness-session-id", session)
	}
	request.Header.Set("x-dsh-gateway-credential", Credential)
	request.Header.Set("authorization", "Bearer benchmark")
	started := time.Now()
	response, err := client.Do(request)
	if err != nil {
		return 0, 0, err
	}
	defer response.Body.Close()
	buffer := make([]byte, 64*1024)
	var first time.Duration
	for {
		n, err := response.Body.Read(buffer)
		if n > 0 && first == 0 {
			first = time.Since(started)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, 0, err
		}
	}
	if response.StatusCode != 200 {
		return 0, 0, fmt.Errorf("%s answered %d", url, response.StatusCode)
	}
	return first.Seconds() * 1000, time.Since(started).Seconds() * 1000, nil
}

func quantile(values []float64, q float64) float64 {
	sort.Float64s(values)
	index := int(float64(len(values)) * q)
	if index >= len(values) {
		index = len(values) - 1
	}
	return values[index]
}

func sessionOf(index int, anonymous bool) string {
	if anonymous {
		return ""
	}
	return "bench-" + strconv.Itoa(index%500)
}

func load(url string, concurrency, count int, anonymous bool, largeMB int) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrency, MaxConnsPerHost: concurrency,
		DisableCompression: true}}
	var mutex sync.Mutex
	var firsts, lasts []float64
	var failure error
	var warm sync.WaitGroup // one request per connection first: connections open, caches warm
	for w := 0; w < concurrency; w++ {
		warm.Add(1)
		go func(w int) {
			defer warm.Done()
			if _, _, err := one(client, url, sessionOf(w, anonymous), body); err != nil {
				mutex.Lock()
				failure = err
				mutex.Unlock()
			}
		}(w)
	}
	warm.Wait()
	next := make(chan int, count)
	for i := 0; i < count; i++ {
		next <- i
	}
	close(next)
	done := make(chan struct{})
	var large sync.WaitGroup
	if largeMB > 0 { // one large request in flight at a time, beside the measured ones
		payload, lone := largeBody(largeMB), &http.Client{Transport: &http.Transport{DisableCompression: true}}
		large.Add(1)
		go func() {
			defer large.Done()
			for index := 0; ; index++ {
				select {
				case <-done:
					return
				default:
				}
				if _, _, err := one(lone, url, "bench-large-"+strconv.Itoa(index%10), payload); err != nil {
					mutex.Lock()
					failure = err
					mutex.Unlock()
					return
				}
			}
		}()
	}
	started := time.Now()
	var group sync.WaitGroup
	for w := 0; w < concurrency; w++ {
		group.Add(1)
		go func() {
			defer group.Done()
			for i := range next {
				first, last, err := one(client, url, sessionOf(i, anonymous), body)
				mutex.Lock()
				if err != nil {
					failure = err
				} else {
					firsts, lasts = append(firsts, first), append(lasts, last)
				}
				mutex.Unlock()
			}
		}()
	}
	group.Wait()
	elapsed := time.Since(started).Seconds()
	close(done)
	large.Wait()
	if failure != nil {
		fmt.Fprintln(os.Stderr, failure)
		os.Exit(1)
	}
	out, _ := json.Marshal(map[string]float64{
		"rps": float64(len(firsts)) / elapsed, "ttfb_p50": quantile(firsts, 0.5), "ttfb_p99": quantile(firsts, 0.99),
		"last_p50": quantile(lasts, 0.5), "last_p99": quantile(lasts, 0.99)})
	fmt.Println(string(out))
}

func main() {
	switch {
	case len(os.Args) == 4 && os.Args[1] == "upstream":
		interval, _ := strconv.Atoi(os.Args[3])
		upstream(os.Args[2], time.Duration(interval)*time.Millisecond)
	case (len(os.Args) == 5 || len(os.Args) == 6) && os.Args[1] == "load":
		concurrency, _ := strconv.Atoi(os.Args[3])
		count, _ := strconv.Atoi(os.Args[4])
		mode, largeMB := "", 0
		if len(os.Args) == 6 {
			mode = os.Args[5]
		}
		if megabytes, found := strings.CutPrefix(mode, "large="); found {
			largeMB, _ = strconv.Atoi(megabytes)
		} else if mode != "" && mode != "anonymous" {
			fmt.Fprintln(os.Stderr, "loadgen load: the mode is anonymous or large=MB, not "+mode)
			os.Exit(2)
		}
		load(os.Args[2], concurrency, count, mode == "anonymous", largeMB)
	default:
		fmt.Fprintln(os.Stderr, "usage: loadgen upstream PORT INTERVAL_MS | loadgen load URL CONCURRENCY COUNT "+
			"[anonymous|large=MB]")
		os.Exit(2)
	}
}
