// What the page tells a student when something stops it: what happened, and what to do.
// The technical reason (the server's error code and reason, a WebSocket close code) is
// shown under it as details, for the teacher.

const percent = (a) => `${(100 * a).toFixed(1)}%`;

/** The state line of a status (worker.js's `state` and `outcome`), in words. */
export function stateMessage(status) {
  const accuracy = status.accuracy !== null && status.accuracy !== undefined
    ? `: final accuracy ${percent(status.accuracy)}` : "";
  switch (status.state) {
    case "starting":
      return "starting: connecting to the class";
    case "loading data":
      return `joined as worker ${status.rank}: downloading this laptop's share of the data`;
    case "training":
      return "training: keep this tab open (reloading is fine, you keep your place)";
    case "finishing":
      return "finishing: testing the final model";
    case "ended":
      return "The class has already ended. Ask your teacher when the next run starts.";
    case "done":
      if (status.outcome === "finished") {
        return `done: this laptop's share is trained${accuracy}. Thank you! You can close this tab.`;
      }
      if (status.outcome === "ended") return `The class has ended${accuracy}. You can close this tab.`;
      return `stopped after ${status.steps} steps (as the page's address asked)${accuracy}.`;
    default:
      return status.state;
  }
}

/**
 * error: {message, code (the server's error code, protocol.md §9), closeCode (the
 * WebSocket's, protocol.md §14)}; status: the last status. Returns {what, todo}.
 */
export function explain(error, status = {}) {
  const accuracy = status.accuracy !== null && status.accuracy !== undefined
    ? ` This laptop's last test accuracy: ${percent(status.accuracy)}.` : "";
  switch (error.code) {
    case "full":
      return { what: "This class is full: every seat is taken.",
        todo: "Ask your teacher for another seat, then reload this page." };
    case "stopping":
      return { what: "The class has already ended.", todo: "Ask your teacher when the next run starts." };
    case "nonfinite":
      return { what: "The training diverged: the model's numbers overflowed, so the server refused them.",
        todo: "Tell your teacher: the next run needs a smaller learning rate (--lr)." };
    case "cannot_follow": // this page refused the run at hello (follow.js): the reason is in the details
      return { what: "This browser cannot take part in this run: the run asks for something this page cannot do.",
        todo: "Tell your teacher (the details are below), or open the page in another browser." };
    case "not_owner":
      return { what: "Another tab of this browser is already this worker.",
        todo: "Close the other tab, or open the page in a new window." };
    default:
  }
  switch (error.closeCode) {
    case 1013:
      return { what: "The class's gateway is full.", todo: "Wait a minute, then reload this page." };
    case 1009:
      return { what: "The class's gateway is busy.", todo: "Wait a minute, then reload this page." };
    case 1000:
    case 1001:
    case 1006:
      return { what: `The class has ended: the teacher's computer closed the connection.${accuracy}`,
        todo: "If your teacher says the class is still on, reload this page." };
    default:
  }
  if (error.unreachable) {
    return { what: "This page cannot reach the teacher's computer.",
      todo: "Check the address on the board and your network, then reload this page." };
  }
  return { what: "This laptop stopped training because of an error.",
    todo: "Reload this page; if it happens again, tell your teacher (the details are below)." };
}
