// The microphone's samples, block by block, from the audio thread to the page: the
// AudioWorklet only copies (no encoding here, nothing that could make the audio thread late).
class CaptureProcessor extends AudioWorkletProcessor {
  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel && channel.length) this.port.postMessage(channel.slice(0));
    return true;
  }
}
registerProcessor("capture", CaptureProcessor);
