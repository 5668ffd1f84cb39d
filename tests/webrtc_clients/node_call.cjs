// A Node app's call to an OpenAI-Realtime WebRTC endpoint with libwebrtc's own bindings
// (@roamhq/wrtc), written as their users write one: an RTCPeerConnection with its defaults, the
// microphone an RTCAudioSource fed 10 ms of a wav at a time, the `oai-events` channel, the
// offer's SDP POSTed as application/sdp (OpenAI's browser quick-start, in Node).
//
//     node node_call.cjs URL WAV SECONDS OUT.json
//
// Waits for the first answer audio, talks for SECONDS more, hangs up (closes the peer
// connection) and writes what it saw to OUT.json. Its key: $OPENAI_API_KEY. Nothing of
// personaplex-edge is used.
const fs = require("fs");
const { RTCPeerConnection, nonstandard: { RTCAudioSource, RTCAudioSink } } = require("@roamhq/wrtc");

function wav48k(path) {  // a PCM16 mono wav -> Int16Array at 48 kHz (linear interpolation)
  const data = fs.readFileSync(path);
  const rate = data.readUInt32LE(24);
  let at = 12;
  while (data.toString("ascii", at, at + 4) !== "data") at += 8 + data.readUInt32LE(at + 4);
  const pcm = new Int16Array(data.buffer.slice(data.byteOffset + at + 8,
                                               data.byteOffset + at + 8 + data.readUInt32LE(at + 4)));
  const out = new Int16Array(Math.floor(pcm.length * 48000 / rate));
  for (let i = 0; i < out.length; i++) {
    const x = i * rate / 48000, j = Math.floor(x), f = x - j;
    out[i] = Math.round(pcm[j] * (1 - f) + (pcm[Math.min(j + 1, pcm.length - 1)] || 0) * f);
  }
  return out;
}

(async () => {
  const [url, wav, seconds, outPath] = process.argv.slice(2);
  const speech = wav48k(wav);
  const pc = new RTCPeerConnection();
  const source = new RTCAudioSource();
  const track = source.createTrack();
  pc.addTrack(track);
  let n = 0;
  const microphone = setInterval(() => {  // 10 ms a tick, the wav over and over
    const samples = new Int16Array(480);
    for (let i = 0; i < 480; i++) samples[i] = speech[(n * 480 + i) % speech.length];
    n++;
    source.onData({ samples, sampleRate: 48000, bitsPerSample: 16, channelCount: 1,
                    numberOfFrames: 480 });
  }, 10);
  const events = [];
  const dc = pc.createDataChannel("oai-events");
  dc.onmessage = (e) => events.push(JSON.parse(e.data));
  const heard = { samples: 0, energy: 0 };
  let answering;
  const firstAudio = new Promise((resolve) => { answering = resolve; });
  let sink = null;
  pc.ontrack = (e) => {
    sink = new RTCAudioSink(e.track);
    sink.ondata = (d) => {
      heard.samples += d.numberOfFrames;
      for (const s of d.samples) heard.energy += (s / 32768) ** 2;
      if (heard.energy > 0) answering();
    };
  };
  await pc.setLocalDescription(await pc.createOffer());
  const r = await fetch(`${url}/v1/realtime/calls?model=gpt-realtime`, {
    method: "POST", body: pc.localDescription.sdp,
    headers: { Authorization: `Bearer ${process.env.OPENAI_API_KEY}`, "Content-Type": "application/sdp" },
  });
  const answer = await r.text();
  const out = { status: r.status, offer: pc.localDescription.sdp };
  if (r.status === 201) {
    await pc.setRemoteDescription({ type: "answer", sdp: answer });
    const t0 = Date.now();
    const failed = new Promise((ok) => {
      pc.onconnectionstatechange = () => ["failed", "closed"].includes(pc.connectionState) && ok(false);
    });
    const answered = await Promise.race([firstAudio.then(() => true), failed,
                                         new Promise((ok) => setTimeout(() => ok(false), 60000))]);
    out.connected_s = answered ? (Date.now() - t0) / 1000 : null;
    out.state = pc.connectionState;
    if (answered) await new Promise((ok) => setTimeout(ok, Number(seconds) * 1000));
    Object.assign(out, { answer, heard, events });
  } else {
    out.error = answer;
  }
  clearInterval(microphone);
  if (sink) sink.stop();
  track.stop();
  pc.close();
  fs.writeFileSync(outPath, JSON.stringify(out));
  process.exit(0);
})().catch((e) => { console.error(e); process.exit(1); });
