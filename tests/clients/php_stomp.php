<?php
// PHP's stomp extension (Debian: php-stomp) against Curb, direct or through `curb router`.
// Usage: php php_stomp.php HOST PORT DESTINATION COUNT PREFETCH
// Sends COUNT receipted messages, consumes them with client-individual acks and a
// prefetch, NACKs the first and ACKs its redelivery, then prints one JSON line (see
// tests/test_clients.py). The extension sends the CONNECT headers it is given, so it asks
// for 1.2; a send with a receipt header waits for that RECEIPT itself. Its ack and nack
// name the frame's message-id, so the 1.2 `id` header (the MESSAGE's ack) is passed too.
[$script, $host, $port, $destination, $count, $prefetch] = $argv;
$count = (int) $count;
$result = ['client' => 'php-stomp ' . phpversion('stomp'), 'sent' => [], 'acked' => [],
           'nacked' => null, 'redelivered' => null, 'errors' => [],
           'version' => null]; // the extension keeps the CONNECTED frame to itself

try {
    $stomp = new Stomp("tcp://$host:$port", '', '', ['accept-version' => '1.2', 'host' => 'localhost']);
    $stomp->setReadTimeout(10);
    for ($n = 0; $n < $count; $n++) {
        $body = "php-$n";
        if ($stomp->send($destination, $body, ['receipt' => "r$n", 'content-type' => 'text/plain'])) {
            $result['sent'][] = $body;
        }
    }
    $stomp->subscribe($destination, ['id' => 's1', 'ack' => 'client-individual', 'prefetch-count' => $prefetch]);
    $seen = [];
    while (count($result['acked']) < $count) {
        $message = $stomp->readFrame();
        if ($message === false) {
            throw new Exception('no MESSAGE within 10 s');
        }
        if ($message->command !== 'MESSAGE') {
            throw new Exception("got $message->command instead of MESSAGE: " . json_encode($message->headers));
        }
        $body = $message->body;
        $ackId = ['id' => $message->headers['ack']];
        if ($result['nacked'] === null) {
            $result['nacked'] = $body;
            $stomp->nack($message, $ackId);
            continue;
        }
        if (($message->headers['redelivered'] ?? '') === 'true') {
            if ($body === $result['nacked'] && $result['redelivered'] === null) {
                $result['redelivered'] = $body;
            } else {
                $result['errors'][] = "unexpected redelivery of $body";
            }
        }
        if (isset($seen[$body])) {
            $result['errors'][] = "$body delivered twice";
        }
        $seen[$body] = true;
        $stomp->ack($message, $ackId);
        $result['acked'][] = $body;
    }
    unset($stomp); // the extension sends DISCONNECT when the object goes
} catch (Throwable $e) {
    $result['errors'][] = get_class($e) . ': ' . $e->getMessage()
        . (method_exists($e, 'getDetails') ? ' ' . $e->getDetails() : '');
}
echo json_encode($result), "\n";
