pub struct ChatTemplate;
pub struct Message;
